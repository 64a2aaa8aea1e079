"""Input items and conversations through the in-process app (deterministic test engine):
``previous_response_id`` chains, ``GET /v1/responses/{id}/input_items``, and input
items refused before anything is written."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_wire import counts
from tests.helpers import open_db, tiny_pdf
from tests.openresponses import check_object

BODY: dict[str, Any] = {"model": "lmsp-test", "seed": 5}


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/responses", json={**BODY, **body})
    assert answer.status_code == 200, answer.text
    obj: dict[str, Any] = answer.json()
    check_object(obj)
    return obj


def error_of(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    return error


def test_a_chain_carries_its_context(client: TestClient) -> None:
    first = create(client, input="Remember the word marmalade.", instructions="Be terse.")
    second = create(client, input="What was the word?", previous_response_id=first["id"])
    third = create(client, input="Say it again.", previous_response_id=second["id"])
    assert second["previous_response_id"] == first["id"]
    assert third["previous_response_id"] == second["id"]
    # the context grows: each turn's prompt holds every earlier input and output
    tokens = [r["usage"]["input_tokens"] for r in (first, second, third)]
    assert tokens[0] < tokens[1] < tokens[2]
    assert second["instructions"] is None  # instructions are not carried over

    page = client.get(f"/v1/responses/{third['id']}/input_items", params={"order": "asc"}).json()
    assert page["object"] == "list" and page["has_more"] is False
    kinds = [(item["type"], item.get("role")) for item in page["data"]]
    assert kinds == [
        ("message", "user"),  # turn 1 input (its instructions are not an item)
        ("message", "assistant"),  # turn 1 output
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),  # this turn's input
    ]
    assert page["data"][0]["content"] == [
        {"type": "input_text", "text": "Remember the word marmalade."}
    ]
    assert page["data"][1] == first["output"][0]
    assert page["data"][3] == second["output"][0]
    assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][-1]["id"])


def test_input_items_pages(client: TestClient) -> None:
    given = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    obj = create(client, input=given)
    url = f"/v1/responses/{obj['id']}/input_items"
    newest = client.get(url, params={"limit": 2}).json()  # default order: desc
    texts = [item["content"][0]["text"] for item in newest["data"]]
    assert texts == ["m4", "m3"] and newest["has_more"] is True
    rest = client.get(url, params={"limit": 10, "after": newest["last_id"]}).json()
    assert [item["content"][0]["text"] for item in rest["data"]] == ["m2", "m1", "m0"]
    assert rest["has_more"] is False
    oldest = client.get(url, params={"order": "asc", "limit": 3}).json()
    assert [item["content"][0]["text"] for item in oldest["data"]] == ["m0", "m1", "m2"]
    error = error_of(client.get(url, params={"after": "msg_nope"}), 404)
    assert error["param"] == "after"
    assert error_of(client.get(url, params={"limit": 0}), 400)["param"] == "limit"
    assert error_of(client.get(url, params={"order": "up"}), 400)["param"] == "order"
    error = error_of(client.get(url, params={"include": "message.output_text.logprobs"}), 400)
    assert error["param"] == "include"
    assert error_of(client.get("/v1/responses/resp_nope/input_items"), 404)["code"] == "not_found"


def _other_client(client: TestClient) -> dict[str, str]:
    made = client.post(
        "/v1/clients", json={"name": "other", "scopes": ["responses:read", "responses:write"]}
    )
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def test_only_the_callers_stored_finished_responses_continue(client: TestClient) -> None:
    mine = create(client, input="mine")
    other = _other_client(client)
    theirs = client.post("/v1/responses", json={**BODY, "input": "x"}, headers=other).json()
    unstored = create(client, input="forget me", store=False)
    deleted = create(client, input="delete me")
    assert client.delete(f"/v1/responses/{deleted['id']}").status_code == 200
    before = counts(client)
    for previous in (theirs["id"], "resp_missing", unstored["id"], deleted["id"]):
        answer = client.post(
            "/v1/responses",
            json={**BODY, "input": "next", "previous_response_id": previous},
            headers={"Idempotency-Key": f"k-{previous}"},
        )
        error = error_of(answer, 404)
        assert (error["code"], error["param"]) == ("not_found", "previous_response_id")
        assert previous in error["message"]
    assert counts(client) == before  # nothing written, not even the idempotency keys
    # the other client cannot continue mine either
    answer = client.post(
        "/v1/responses",
        json={**BODY, "input": "next", "previous_response_id": mine["id"]},
        headers=other,
    )
    assert error_of(answer, 404)["param"] == "previous_response_id"
    assert client.get(f"/v1/responses/{mine['id']}/input_items", headers=other).status_code == 404


def test_an_unfinished_response_cannot_be_continued(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.1")  # read when the model loads
    running = client.post(
        "/v1/responses", json={**BODY, "input": "slow", "background": True}
    ).json()
    before = counts(client)
    answer = client.post(
        "/v1/responses",
        json={**BODY, "input": "next", "previous_response_id": running["id"]},
        headers={"Idempotency-Key": "early"},
    )
    error = error_of(answer, 409)
    assert (error["code"], error["param"]) == ("response_in_progress", "previous_response_id")
    after = counts(client)
    for table in ("responses", "tasks", "idempotency_keys"):  # the running task logs on
        assert after[table] == before[table]
    assert client.post(f"/v1/responses/{running['id']}/cancel").status_code == 200


def test_a_turn_references_its_history_and_a_delete_removes_it_everywhere(
    client: TestClient,
) -> None:
    """A turn keeps its own input and a reference to the turn it continues (not a copy
    of the history), so deleting an earlier turn removes its content from every later
    turn: continuing, or listing the input of, a turn whose history lost a response is
    ``409 history_deleted``; the later turn itself is still there."""
    first = create(client, input="one")
    second = create(client, input="two", previous_response_id=first["id"])
    third = create(client, input="three", previous_response_id=second["id"])
    page = client.get(f"/v1/responses/{third['id']}/input_items", params={"order": "asc"})
    assert len(page.json()["data"]) == 5  # one, its answer, two, its answer, three
    conn = open_db(client.app.state.lmsp.settings.data_dir)  # type: ignore[attr-defined]
    try:
        stored = conn.execute(
            "SELECT request, previous_id FROM responses WHERE id = ?", (third["id"],)
        ).fetchone()
    finally:
        conn.close()
    assert stored["previous_id"] == second["id"]
    assert "lmsp_history" not in json.loads(stored["request"])
    assert "one" not in stored["request"]  # no copy of the earlier turns

    assert client.delete(f"/v1/responses/{first['id']}").status_code == 200
    before = counts(client)
    for previous in (second["id"], third["id"]):
        answer = client.post(
            "/v1/responses", json={**BODY, "input": "four", "previous_response_id": previous}
        )
        error = error_of(answer, 409)
        assert (error["code"], error["param"]) == ("history_deleted", "previous_response_id")
        assert first["id"] in error["message"]
    assert counts(client) == before
    error = error_of(client.get(f"/v1/responses/{third['id']}/input_items"), 409)
    assert error["code"] == "history_deleted"
    assert client.get(f"/v1/responses/{third['id']}").json()["status"] == "completed"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_item_kind_is_accepted(client: TestClient) -> None:
    given = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {
            "role": "user",
            "content": [
                {"type": "input_file", "filename": "a.md", "file_data": b64(b"# kumquat")},
                {
                    "type": "input_file",
                    "filename": "b.pdf",
                    "file_data": f"data:application/pdf;base64,{b64(tiny_pdf('zanzibar'))}",
                },
            ],
        },
    ]
    obj = create(client, input=given)
    assert obj["status"] == "completed"
    page = client.get(
        f"/v1/responses/{obj['id']}/input_items", params={"order": "asc", "limit": 100}
    ).json()
    assert [item["type"] for item in page["data"]] == [
        "message",
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    # the file's text reached the prompt: a longer file makes a longer prompt
    small = create(client, input=given[-1:])
    longer = [
        {
            "role": "user",
            "content": [
                {"type": "input_file", "filename": "a.md", "file_data": b64(b"# kumquat" * 10)},
                given[-1]["content"][1],
            ],
        }
    ]
    large = create(client, input=longer)
    assert large["usage"]["input_tokens"] - small["usage"]["input_tokens"] == 9 * len("# kumquat")


@pytest.mark.parametrize(
    ("given", "code", "param"),
    [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://x/a.png"}],
                }
            ],
            "unsupported_input",
            "input.0.content.0",
        ),
        ([{"type": "web_search_call", "id": "ws_1"}], "unsupported_input", "input.0.type"),
        (
            [{"role": "user", "content": [{"type": "input_video", "url": "x"}]}],
            "unsupported_input",
            "input.0.content.0.type",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "input_file", "filename": "a.bin", "file_data": "AA=="}],
                }
            ],
            "unsupported_input",
            "input.0.content.0",
        ),
    ],
)
def test_refused_items_write_nothing(
    client: TestClient, given: list[dict[str, Any]], code: str, param: str
) -> None:
    before = counts(client)
    answer = client.post(
        "/v1/responses", json={**BODY, "input": given}, headers={"Idempotency-Key": "bad"}
    )
    error = error_of(answer, 400)
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error"
    assert counts(client) == before


def test_models_report_capabilities(client: TestClient) -> None:
    model = client.get("/v1/models/lmsp-test").json()
    assert model["capabilities"] == ["completion"]


def test_chat_tool_messages_become_function_call_output_items(client: TestClient) -> None:
    answer = client.post(
        "/v1/chat/completions",
        json={
            "model": "lmsp-test",
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        },
    )
    assert answer.status_code == 200, answer.text
    page = client.get(
        f"/v1/responses/{answer.json()['id']}/input_items", params={"order": "asc"}
    ).json()
    assert [item["type"] for item in page["data"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert page["data"][2]["output"] == "sunny"
