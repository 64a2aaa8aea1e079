"""The Conversations API, ``conversation`` on a create, compaction and input token
counts, in process with the deterministic test engine, on both stores (SQLite and
PostgreSQL)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.config import Settings
from lmsp.protocol import compaction
from lmsp.runner.retention import sweep
from lmsp.store import conversations
from lmsp.store.conversations import Quota
from tests.pgcluster import store_reader

MODEL = "lmsp-test"


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"))


CM = "context_management"


def ok(answer: Any, status: int = 200) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    return body


def other_client(client: TestClient) -> dict[str, str]:
    made = ok(
        client.post(
            "/v1/clients",
            json={"name": "other", "scopes": ["responses:read", "responses:write"]},
        ),
        201,
    )
    return {"Authorization": f"Bearer {made['token']}"}


def listed(client: TestClient, conv: str, **params: Any) -> list[dict[str, Any]]:
    return list(ok(client.get(f"/v1/conversations/{conv}/items", params=params))["data"])


def texts(items: list[dict[str, Any]]) -> list[str]:
    return [
        "".join(part.get("text", "") for part in item.get("content", []))
        for item in items
        if item["type"] == "message"
    ]


def test_crud_pages_and_ownership(client: TestClient) -> None:
    conv = ok(
        client.post(
            "/v1/conversations",
            json={
                "metadata": {"topic": "x"},
                "items": [{"role": "user", "content": f"m{i}"} for i in range(5)],
            },
        )
    )
    assert conv["object"] == "conversation" and conv["id"].startswith("conv_")
    assert conv["metadata"] == {"topic": "x"}
    cid = conv["id"]
    assert ok(client.get(f"/v1/conversations/{cid}")) == conv
    assert texts(listed(client, cid, order="asc")) == [f"m{i}" for i in range(5)]
    assert texts(listed(client, cid)) == [f"m{i}" for i in reversed(range(5))]  # desc default
    page = ok(client.get(f"/v1/conversations/{cid}/items", params={"order": "asc", "limit": 2}))
    assert texts(page["data"]) == ["m0", "m1"] and page["has_more"]
    rest = listed(client, cid, order="asc", after=page["last_id"], limit=10)
    assert texts(rest) == ["m2", "m3", "m4"]
    # add, retrieve, delete an item
    added = ok(
        client.post(
            f"/v1/conversations/{cid}/items",
            json={"items": [{"type": "message", "role": "assistant", "content": "m5"}]},
        )
    )
    item_id = added["data"][0]["id"]
    assert added["first_id"] == added["last_id"] == item_id
    assert ok(client.get(f"/v1/conversations/{cid}/items/{item_id}"))["role"] == "assistant"
    assert ok(client.delete(f"/v1/conversations/{cid}/items/{item_id}"))["id"] == cid
    assert client.get(f"/v1/conversations/{cid}/items/{item_id}").status_code == 404
    # metadata update
    updated = ok(client.post(f"/v1/conversations/{cid}", json={"metadata": {"topic": "y"}}))
    assert updated["metadata"] == {"topic": "y"}
    # another client: 404 everywhere, nothing changed
    other = other_client(client)
    for method, url, body in (
        ("GET", f"/v1/conversations/{cid}", None),
        ("POST", f"/v1/conversations/{cid}", {"metadata": {}}),
        ("GET", f"/v1/conversations/{cid}/items", None),
        ("POST", f"/v1/conversations/{cid}/items", {"items": [{"role": "user", "content": "x"}]}),
        ("GET", f"/v1/conversations/{cid}/items/{rest[0]['id']}", None),
        ("DELETE", f"/v1/conversations/{cid}/items/{rest[0]['id']}", None),
        ("DELETE", f"/v1/conversations/{cid}", None),
    ):
        answer = client.request(method, url, json=body, headers=other)
        assert answer.status_code == 404, (method, url, answer.text)
    answer = client.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "conversation": cid}, headers=other
    )
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "conversation"
    assert len(listed(client, cid, limit=100)) == 5
    # bad input writes nothing
    bad = client.post("/v1/conversations/" + cid + "/items", json={"items": [{"role": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "items.0.role"
    too_many = [{"role": "user", "content": "x"}] * 21
    assert client.post("/v1/conversations", json={"items": too_many}).status_code == 400
    assert len(listed(client, cid, limit=100)) == 5
    # delete
    gone = ok(client.delete(f"/v1/conversations/{cid}"))
    assert gone == {"id": cid, "object": "conversation.deleted", "deleted": True}
    assert client.get(f"/v1/conversations/{cid}").status_code == 404


def test_turns_append_input_and_output_in_order(client: TestClient, settings: Settings) -> None:
    cid = ok(client.post("/v1/conversations", json={}))["id"]
    first = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "one", "conversation": cid, "max_output_tokens": 4},
        )
    )
    assert first["conversation"] == {"id": cid}
    second = ok(
        client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": [{"role": "user", "content": "two"}],
                "conversation": {"id": cid},
                "max_output_tokens": 4,
            },
        )
    )
    got = listed(client, cid, order="asc", limit=100)
    assert [(i["type"], i.get("role")) for i in got] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert [got[1]["id"], got[3]["id"]] == [first["output"][0]["id"], second["output"][0]["id"]]
    # the second turn's context held the first turn (its input items list it)
    inputs = ok(client.get(f"/v1/responses/{second['id']}/input_items", params={"order": "asc"}))
    assert [i["id"] for i in inputs["data"]] == [i["id"] for i in got[:3]]
    # its prompt counted the history: more input tokens than the same turn alone
    alone = ok(
        client.post(
            "/v1/responses/input_tokens",
            json={"model": MODEL, "input": [{"role": "user", "content": "two"}]},
        )
    )
    assert second["usage"]["input_tokens"] > alone["input_tokens"]
    # a stream turn and a background turn append too
    with client.stream(
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "three", "conversation": cid, "stream": True},
    ) as answer:
        assert answer.status_code == 200
        answer.read()
    bg = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "four", "conversation": cid, "background": True},
        ),
        202,
    )
    deadline = time.monotonic() + 60
    while ok(client.get(f"/v1/responses/{bg['id']}"))["status"] not in ("completed", "incomplete"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    got = listed(client, cid, order="asc", limit=100)
    assert [t for t in texts(got) if t in ("one", "two", "three", "four")] == [
        "one",
        "two",
        "three",
        "four",
    ]
    assert len(got) == 8
    conn = store_reader(settings)
    assert (
        conn.execute("SELECT count(*) FROM responses WHERE conversation_id = ?", (cid,)).fetchone()[
            0
        ]
        == 4
    )
    conn.close()
    # retention: a conversation used within the period stays, its items too
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    assert sweep(svc.db, 3600, conversations=3600).conversations == 0
    assert [i["id"] for i in listed(client, cid, order="asc", limit=100)] == [i["id"] for i in got]
    # past it, its finished responses go, and then the conversation with its items
    # by default (PROTOCOL.md 10) retention never deletes a conversation
    assert sweep(svc.db, 3600).conversations == 0
    # an age of -1 h: everything finished so far
    swept = sweep(svc.db, -3600, conversations=-3600)
    assert swept.responses >= 4 and swept.conversations >= 1
    assert client.get(f"/v1/responses/{first['id']}").status_code == 404
    assert client.get(f"/v1/conversations/{cid}").status_code == 404
    conn = store_reader(settings)
    gone = "SELECT count(*) FROM conversation_items WHERE conversation_id = ?"
    assert conn.execute(gone, (cid,)).fetchone()[0] == 0
    conn.close()


def test_failed_and_cancelled_turns_add_nothing(client: TestClient) -> None:
    cid = ok(client.post("/v1/conversations", json={}))["id"]
    failed = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "boom [engine-error]", "conversation": cid},
        )
    )
    assert failed["status"] == "failed"
    assert listed(client, cid) == []  # the failed turn added nothing
    # an incomplete turn (max_output_tokens reached) is a turn: appended
    cut = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "cut", "conversation": cid, "max_output_tokens": 1},
        )
    )
    assert cut["status"] == "incomplete"
    got = listed(client, cid, order="asc")
    assert [i["id"] for i in got[1:]] == [cut["output"][0]["id"]]
    assert got[1]["status"] == "incomplete"
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()  # the turn stays queued until cancelled
    queued = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "later", "conversation": cid, "background": True},
        ),
        202,
    )
    assert ok(client.post(f"/v1/responses/{queued['id']}/cancel"))["status"] == "cancelled"
    assert [i["id"] for i in listed(client, cid, order="asc")] == [i["id"] for i in got]


def test_conversation_refusals(client: TestClient) -> None:
    cid = ok(client.post("/v1/conversations", json={}))["id"]
    prev = ok(client.post("/v1/responses", json={"model": MODEL, "input": "hi"}))["id"]
    conv = {"conversation": cid}
    for body, param in (
        ({"conversation": cid, "previous_response_id": prev}, "conversation"),
        ({"conversation": "nope"}, "conversation"),
        ({"conversation": {"id": cid, "x": 1}}, "conversation.x"),
        ({"conversation": "conv_missing"}, "conversation"),
        ({"context_management": [{"type": "compaction"}]}, f"{CM}.0.compact_threshold"),
        ({"context_management": [{"type": "other", "compact_threshold": 5}]}, f"{CM}.0.type"),
        ({"context_management": [{"type": "compaction", "compact_threshold": 5}], **conv}, CM),
    ):
        answer = client.post("/v1/responses", json={"model": MODEL, "input": "x", **body})
        assert answer.status_code in (400, 404), answer.text
        assert answer.json()["error"]["param"] == param, (body, answer.text)
    assert listed(client, cid) == []


def history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n // 2):
        out.append({"role": "user", "content": f"question {i} " + "about many things " * 5})
        out.append({"role": "assistant", "content": f"answer {i} " + "with plenty of words " * 5})
    return out


def test_compact_and_count(client: TestClient) -> None:
    given = [*history(24), {"role": "user", "content": "and now?"}]
    whole = ok(client.post("/v1/responses/input_tokens", json={"model": MODEL, "input": given}))
    assert whole["object"] == "response.input_tokens" and whole["input_tokens"] > 0
    compacted = ok(client.post("/v1/responses/compact", json={"model": MODEL, "input": given}))
    assert compacted["object"] == "response.compaction"
    output = compacted["output"]
    assert output[0]["type"] == "compaction"
    assert output[0]["encrypted_content"].startswith(compaction.VERSION + ".")
    assert [i.get("role") for i in output[1:]] == ["user"]  # the newest turn, kept
    assert compacted["usage"]["output_tokens"] > 0
    after = ok(client.post("/v1/responses/input_tokens", json={"model": MODEL, "input": output}))
    assert after["input_tokens"] < whole["input_tokens"]
    # the compacted output is valid input; an edited compaction item is refused
    ok(client.post("/v1/responses", json={"model": MODEL, "input": output}))
    content = output[0]["encrypted_content"]
    edited = [{**output[0], "encrypted_content": content[:-1] + "01"[content[-1] == "0"]}]
    answer = client.post("/v1/responses", json={"model": MODEL, "input": edited})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "input.0.encrypted_content"
    # the summary's response does not linger: a compaction leaves no task behind
    before = len(ok(client.get("/v1/tasks", params={"limit": 100}))["data"])
    ok(client.post("/v1/responses/compact", json={"model": MODEL, "input": given}))
    assert len(ok(client.get("/v1/tasks", params={"limit": 100}))["data"]) == before


def test_count_includes_instructions_tools_and_conversation(client: TestClient) -> None:
    base = {"model": MODEL, "input": "hello"}
    plain = ok(client.post("/v1/responses/input_tokens", json=base))["input_tokens"]
    with_instr = ok(
        client.post("/v1/responses/input_tokens", json={**base, "instructions": "be brief " * 10})
    )["input_tokens"]
    assert with_instr > plain
    cid = ok(
        client.post(
            "/v1/conversations", json={"items": [{"role": "user", "content": "earlier " * 20}]}
        )
    )["id"]
    with_conv = ok(client.post("/v1/responses/input_tokens", json={**base, "conversation": cid}))[
        "input_tokens"
    ]
    assert with_conv > plain
    made = ok(client.post("/v1/responses", json={**base, "conversation": cid}))
    assert made["usage"]["input_tokens"] == with_conv
    answer = client.post(
        "/v1/responses/input_tokens",
        json={**base, "context_management": [{"type": "compaction", "compact_threshold": 1}]},
    )
    assert answer.status_code == 400


def test_context_management_compacts_past_its_threshold(client: TestClient) -> None:
    given = [*history(24), {"role": "user", "content": "and now?"}]
    whole = ok(client.post("/v1/responses/input_tokens", json={"model": MODEL, "input": given}))
    below = ok(
        client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": given,
                "context_management": [
                    {"type": "compaction", "compact_threshold": whole["input_tokens"] + 10}
                ],
            },
        )
    )
    assert below["usage"]["input_tokens"] == whole["input_tokens"]
    made = ok(
        client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": given,
                "context_management": [{"type": "compaction", "compact_threshold": 50}],
            },
        )
    )
    assert made["usage"]["input_tokens"] < whole["input_tokens"]
    inputs = ok(client.get(f"/v1/responses/{made['id']}/input_items", params={"order": "asc"}))
    assert inputs["data"][0]["type"] == "compaction"


def test_a_turn_is_appended_whole_or_not_at_all(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append runs in the transaction that finishes the response: if it breaks half
    way (here: after the first item), the whole transaction is undone — no item, and
    the response is not recorded completed either."""
    from lmsp.store import conversations

    cid = ok(client.post("/v1/conversations", json={}))["id"]
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    made = ok(
        client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "half", "conversation": cid, "background": True},
        ),
        202,
    )
    real = conversations._dumps
    calls: list[int] = []

    def breaking(value: Any) -> str:
        if isinstance(value, dict) and value.get("type") in ("message", "function_call"):
            calls.append(1)
            if len(calls) == 2:  # the output item, after the input item was inserted
                raise RuntimeError("the disk went away")
        return real(value)

    monkeypatch.setattr(conversations, "_dumps", breaking)
    svc.runner.run_next()
    monkeypatch.setattr(conversations, "_dumps", real)
    assert len(calls) == 2
    assert listed(client, cid) == []
    status = ok(client.get(f"/v1/responses/{made['id']}"))["status"]
    assert status == "failed", status  # the runner records the failure instead


def test_a_replayed_create_does_not_compact_again(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmsp.app import compaction as api_compaction

    real = api_compaction.summarize
    summaries: list[int] = []

    async def counting(*args: Any, **kwargs: Any) -> Any:
        summaries.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(api_compaction, "summarize", counting)
    given = [*history(24), {"role": "user", "content": "and now?"}]
    body = {
        "model": MODEL,
        "input": given,
        "context_management": [{"type": "compaction", "compact_threshold": 50}],
    }
    first = ok(client.post("/v1/responses", json=body, headers={"Idempotency-Key": "k1"}))
    assert summaries == [1]
    again = client.post("/v1/responses", json=body, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first["id"]
    assert summaries == [1]  # the replay answered the first response, summarizing nothing


# -- one client's large conversation (issue 36, item 7) -----------------------------------------
def small(count: int, size: int = 20, tag: str = "m") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag}{i}:" + "x" * size} for i in range(count)]


def counts_agree(settings: Settings) -> None:
    """Every conversation's counted size is what it holds."""
    conn = store_reader(settings)
    length = "octet_length(i.item)" if settings.database_url else "length(CAST(i.item AS BLOB))"
    rows = conn.execute(
        "SELECT c.id, c.item_count, c.item_bytes,"
        " (SELECT count(*) FROM conversation_items i WHERE i.conversation_id = c.id),"
        f" (SELECT coalesce(sum({length}), 0) FROM conversation_items i"
        "  WHERE i.conversation_id = c.id) FROM conversations c"
    ).fetchall()
    conn.close()
    for row in rows:
        assert (row[1], row[2]) == (row[3], row[4]), row[0]


def quota_code(answer: Any, param: str) -> str:
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("conversation_quota_exceeded", param)
    return str(error["message"])


def test_quotas_refuse_whole_and_count_exactly(client: TestClient, settings: Settings) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.quota = Quota(items=6, bytes=4000, client_bytes=6000)
    cid = ok(client.post("/v1/conversations", json={"items": small(4)}))["id"]
    message = quota_code(
        client.post(f"/v1/conversations/{cid}/items", json={"items": small(3)}), "items"
    )
    assert "LMSP_CONVERSATION_MAX_ITEMS" in message
    ok(client.post(f"/v1/conversations/{cid}/items", json={"items": small(2)}))
    assert len(listed(client, cid, limit=100)) == 6
    turn = {"model": MODEL, "input": "more", "conversation": cid, "max_output_tokens": 2}
    conn = store_reader(settings)
    stored = "SELECT count(*) FROM responses"
    before = conn.execute(stored).fetchone()[0]
    quota_code(client.post("/v1/responses", json=turn), "conversation")
    assert conn.execute(stored).fetchone()[0] == before
    conn.close()
    # room for one input item: the turn runs, and its output is appended whole past 6
    oldest = listed(client, cid, order="asc", limit=1)[0]["id"]
    ok(client.delete(f"/v1/conversations/{cid}/items/{oldest}"))
    assert ok(client.post("/v1/responses", json=turn))["status"] in ("completed", "incomplete")
    assert len(listed(client, cid, limit=100)) == 7
    quota_code(client.post("/v1/responses", json=turn), "conversation")
    # bytes: of one conversation, then of all of the client's
    cid2 = ok(client.post("/v1/conversations", json={"items": small(1, 3000)}))["id"]
    added = client.post(f"/v1/conversations/{cid2}/items", json={"items": small(1, 1000)})
    assert "LMSP_CONVERSATION_MAX_BYTES" in quota_code(added, "items")
    third = client.post("/v1/conversations", json={"items": small(1, 2500)})
    assert "LMSP_CLIENT_CONVERSATION_BYTES" in quota_code(third, "items")
    # another client's conversations are counted apart
    ok(
        client.post(
            "/v1/conversations", json={"items": small(1, 2500)}, headers=other_client(client)
        )
    )
    counts_agree(settings)


def test_a_long_conversation_turn_reads_its_newest_items(client: TestClient) -> None:
    cid = ok(client.post("/v1/conversations", json={}))["id"]
    for batch in range(15):  # 300 items of ~110 bytes: the test engine's context is 4,096
        ok(
            client.post(
                f"/v1/conversations/{cid}/items", json={"items": small(20, 100, f"b{batch}.")}
            )
        )
    body = {"model": MODEL, "conversation": cid, "truncation": "auto", "max_output_tokens": 2}
    done = ok(client.post("/v1/responses", json={**body, "input": "now"}))
    assert done["status"] in ("completed", "incomplete")
    dropped = done["truncated_input"]
    assert (
        dropped["items"] > 250
        and dropped["first"]["id"] == listed(client, cid, order="asc", limit=1)[0]["id"]
    )
    # the run (in the background too) reads the items it kept, and the prompt is the same
    bg = ok(client.post("/v1/responses", json={**body, "input": "now", "background": True}), 202)
    deadline = time.monotonic() + 60
    while (got := ok(client.get(f"/v1/responses/{bg['id']}")))["status"] in (
        "queued",
        "in_progress",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got["usage"]["input_tokens"] > 0
    # input items, paged from either end
    newest = ok(client.get(f"/v1/responses/{done['id']}/input_items", params={"limit": 2}))
    assert texts(newest["data"]) == ["now", "b14.19:" + "x" * 100] and newest["has_more"]
    oldest = ok(
        client.get(f"/v1/responses/{done['id']}/input_items", params={"limit": 2, "order": "asc"})
    )
    assert texts(oldest["data"]) == ["b0.0:" + "x" * 100, "b0.1:" + "x" * 100]
    last = ok(
        client.get(
            f"/v1/responses/{done['id']}/input_items",
            params={"order": "asc", "after": newest["data"][1]["id"], "limit": 5},
        )
    )
    assert texts(last["data"]) == ["now"] and not last["has_more"]
    missing = client.get(f"/v1/responses/{done['id']}/input_items", params={"after": "msg_x"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "after"
    # without truncation: refused once the context is known to be full; a count stops
    # at four contexts
    for path in ("/v1/responses", "/v1/responses/input_tokens"):
        answer = client.post(path, json={**body, "truncation": "disabled", "input": "x"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "context_length_exceeded"
        assert "at least" in answer.json()["error"]["message"]


def test_retention_sweeps_unused_conversations_once_their_turns_are_gone(
    client: TestClient, settings: Settings
) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    week = 7 * 86400.0
    talked = ok(client.post("/v1/conversations", json={"items": small(2)}))["id"]
    turn = ok(
        client.post("/v1/responses", json={"model": MODEL, "input": "hi", "conversation": talked})
    )
    idle = ok(client.post("/v1/conversations", json={"items": small(2)}))["id"]
    fresh = ok(client.post("/v1/conversations", json={}))["id"]

    def age(sql: str, *args: Any) -> None:
        svc.db.write_sync(lambda c: c.execute(sql, (int(time.time()) - 10 * 86400, *args)))

    age("UPDATE conversations SET updated_at = ? WHERE id IN (?, ?)", talked, idle)
    assert sweep(svc.db, week).conversations == 0  # by default: never (PROTOCOL.md 10)
    swept = sweep(svc.db, week, conversations=week)
    assert swept.conversations == 1  # the idle one; the other's turn is still stored
    assert client.get(f"/v1/conversations/{idle}").status_code == 404
    assert client.get(f"/v1/conversations/{talked}").status_code == 200
    assert client.get(f"/v1/conversations/{fresh}").status_code == 200
    age("UPDATE tasks SET finished_at = ? WHERE response_id = ?", turn["id"])
    swept = sweep(svc.db, week, conversations=week)
    assert (swept.responses, swept.conversations) == (1, 1)
    assert client.get(f"/v1/conversations/{talked}").status_code == 404
    assert client.get(f"/v1/conversations/{fresh}").status_code == 200
    conn = store_reader(settings)
    left = conn.execute(
        "SELECT count(*) FROM conversation_items WHERE conversation_id IN (?, ?)", (talked, idle)
    ).fetchone()[0]
    conn.close()
    assert left == 0


def test_a_page_of_items_is_bounded_in_bytes(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET …/items`` ends a page early once it holds ``PAGE_BYTES`` (never with no
    item), and ``after`` pages on through every item."""
    monkeypatch.setattr(conversations, "PAGE_BYTES", 3000)
    cid = ok(client.post("/v1/conversations", json={"items": small(10, 1000)}))["id"]
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"order": "asc", "limit": 100}
        if after is not None:
            params["after"] = after
        page = ok(client.get(f"/v1/conversations/{cid}/items", params=params))
        assert 1 <= len(page["data"]) <= 3
        seen += texts(page["data"])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == [f"m{i}:" + "x" * 1000 for i in range(10)]
    monkeypatch.setattr(conversations, "PAGE_BYTES", 10)  # one item larger than a page
    assert len(listed(client, cid, limit=100)) == 1
