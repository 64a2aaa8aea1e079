"""Conversations and input items through a real server and the real model (SmolLM2):
a three-turn ``previous_response_id`` chain with ``kill -9`` between the turns, and
every input item kind, files included, reaching the prompt. And one client's large
conversation against everyone (issue 36, item 7), on the test engine: its quotas (the
refused append writes nothing), retention of the unused ones, and a turn that reads only
the newest items its context holds."""

from __future__ import annotations

import base64
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, message_text, open_db, tiny_pdf
from tests.openresponses import check_object

MODEL = "smollm2-135m-instruct"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 40}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def post(http: httpx.Client, **body: Any) -> dict[str, Any]:
    answer = http.post("/v1/responses", json={**GREEDY, **body})
    assert answer.status_code == 200, answer.text
    obj: dict[str, Any] = answer.json()
    check_object(obj)
    assert obj["status"] == "completed" or obj["status"] == "incomplete", obj
    return obj


@pytest.mark.slow
def test_a_three_turn_chain_survives_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir).start()
    try:
        with server.client(timeout=300) as http:
            first = post(
                http,
                input="The password is BANANA. Reply with just the password: BANANA.",
            )
        server.restart()  # kill -9, then a new process on the same data directory
        with server.client(timeout=300) as http:
            second = post(
                http,
                input="What is the password? Reply with one word.",
                previous_response_id=first["id"],
            )
        server.restart()
        with server.client(timeout=300) as http:
            third = post(http, input="Say the password again.", previous_response_id=second["id"])
            # the third turn's input items are the whole chain, after two crashes
            page = http.get(
                f"/v1/responses/{third['id']}/input_items", params={"order": "asc"}
            ).json()
            # another client's id and a missing id: the clear error, nothing written
            other = http.post(
                "/v1/clients",
                json={"name": "other", "scopes": ["responses:read", "responses:write"]},
            ).json()
            conn = open_db(data_dir)
            before = conn.execute("SELECT count(*) FROM responses").fetchone()[0]
            conn.close()
            for previous, headers in (
                (third["id"], {"Authorization": f"Bearer {other['token']}"}),
                ("resp_0000000000000000", {}),
            ):
                answer = http.post(
                    "/v1/responses",
                    json={**GREEDY, "input": "more", "previous_response_id": previous},
                    headers=headers,
                )
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["param"] == "previous_response_id"
            conn = open_db(data_dir)
            assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] == before
            check_log_invariants(conn)
            conn.close()
    finally:
        server.stop()
    tokens = [r["usage"]["input_tokens"] for r in (first, second, third)]
    # each turn's prompt holds every earlier input and output
    assert tokens[0] < tokens[1] < tokens[2], tokens
    assert tokens[1] > tokens[0] + first["usage"]["output_tokens"]
    assert tokens[2] > tokens[1] + second["usage"]["output_tokens"]
    assert [item["type"] for item in page["data"]] == ["message"] * 5
    assert message_text(page["data"][1:2]) == message_text(first["output"])
    # the model read the first turn: it gives the password it was only told there
    assert "BANANA" in message_text(second["output"]).upper(), second["output"]


@pytest.mark.slow
def test_every_input_item_kind_through_the_real_model(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    note = b"The secret code word is PLATYPUS."
    pdf = tiny_pdf("The secret code word is PLATYPUS.")
    ask = {"type": "input_text", "text": "What does the file say?"}
    try:
        with server.client(timeout=300) as http:
            bare = post(http, input=[{"role": "user", "content": [ask]}])
            text_file = post(
                http,
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_file", "filename": "note.txt", "file_data": b64(note)},
                            ask,
                        ],
                    }
                ],
            )
            pdf_file = post(
                http,
                input=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_file",
                                "filename": "note.pdf",
                                "file_data": f"data:application/pdf;base64,{b64(pdf)}",
                            },
                            ask,
                        ],
                    }
                ],
            )
            tools = post(
                http,
                input=[
                    {"type": "message", "role": "developer", "content": "You use tools."},
                    {"role": "user", "content": "What is 6 times 7?"},
                    {"type": "function_call", "call_id": "c1", "name": "mul", "arguments": "[6,7]"},
                    {"type": "function_call_output", "call_id": "c1", "output": "42"},
                    {"role": "user", "content": "So what is the answer?"},
                ],
            )
            history = post(
                http,
                input=[
                    {"role": "user", "content": "Hi."},
                    {
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hello! How can I help?"}],
                    },
                    {"role": "user", "content": [{"type": "input_text", "text": "Insult me."}]},
                    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I won't."}]},
                    {"role": "user", "content": [ask]},
                ],
            )
            image = http.post(
                "/v1/responses",
                json={
                    **GREEDY,
                    "input": [
                        {
                            "role": "user",
                            "content": [
                                ask,
                                {"type": "input_image", "image_url": "https://x/y.png"},
                            ],
                        }
                    ],
                },
            )
    finally:
        server.stop()
    # the file's text reached the prompt: more input tokens, and the model read it
    extra = len(note) // 8  # at least a token per 8 bytes
    assert text_file["usage"]["input_tokens"] > bare["usage"]["input_tokens"] + extra
    assert pdf_file["usage"]["input_tokens"] > bare["usage"]["input_tokens"] + extra
    assert "PLATYPUS" in message_text(text_file["output"]).upper(), text_file["output"]
    assert "PLATYPUS" in message_text(pdf_file["output"]).upper(), pdf_file["output"]
    assert "PLATYPUS" not in message_text(bare["output"]).upper()
    # the tool's result reached the model (it knows the product only from there)
    assert "42" in message_text(tools["output"]), tools["output"]
    assert history["usage"]["input_tokens"] > bare["usage"]["input_tokens"] + 15
    assert image.status_code == 400
    error = image.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_input", "input.0.content.1")


# -- one client's large conversation (issue 36, item 7) -----------------------------------------
TEST = "lmsp-test"  # the test engine: a token a byte, a context of 4,096
QUOTAS = {
    "LMSP_CONVERSATION_MAX_ITEMS": "25",
    "LMSP_CONVERSATION_MAX_BYTES": "65536",
    "LMSP_CLIENT_CONVERSATION_BYTES": "102400",
}


def messages(count: int, size: int = 10, tag: str = "m") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag}{i}:" + "x" * size} for i in range(count)]


def new_client(http: httpx.Client, name: str) -> httpx.Client:
    made = http.post(
        "/v1/clients", json={"name": name, "scopes": ["responses:read", "responses:write"]}
    )
    assert made.status_code == 201, made.text
    return httpx.Client(
        base_url=str(http.base_url),
        headers={"Authorization": f"Bearer {made.json()['token']}"},
        timeout=120,
    )


def refused(answer: httpx.Response, param: str, setting: str) -> None:
    """``409 conversation_quota_exceeded`` in section 8's shape, naming the quota's setting,
    and telling the SDKs not to retry."""
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert (error["type"], error["code"], error["param"]) == (
        "conflict_error",
        "conversation_quota_exceeded",
        param,
    )
    assert setting in error["message"]
    assert answer.headers["x-should-retry"] == "false"


def sizes(data_dir: Path) -> list[tuple[str, int, int, int, int]]:
    """Each conversation's counted size against what it holds: (id, item_count, items,
    item_bytes, bytes)."""
    conn = open_db(data_dir)
    try:
        rows = conn.execute(
            "SELECT c.id, c.item_count, c.item_bytes,"
            " (SELECT count(*) FROM conversation_items i WHERE i.conversation_id = c.id),"
            " (SELECT coalesce(sum(length(CAST(i.item AS BLOB))), 0) FROM conversation_items i"
            "  WHERE i.conversation_id = c.id) FROM conversations c"
        ).fetchall()
    finally:
        conn.close()
    return [(r[0], r[1], r[3], r[2], r[4]) for r in rows]


def counts_agree(data_dir: Path) -> None:
    for ident, counted, held, counted_bytes, held_bytes in sizes(data_dir):
        assert (counted, counted_bytes) == (held, held_bytes), ident


def table_count(data_dir: Path, table: str) -> int:
    conn = open_db(data_dir)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def test_conversation_quotas_refuse_the_append_whole(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, env=QUOTAS).start()
    try:
        with server.client() as owner, new_client(owner, "hoarder") as http:
            # items: 20 in, 6 more would pass 25 (refused whole, nothing written), 5 fit
            cid = http.post("/v1/conversations", json={"items": messages(20)}).json()["id"]
            before = table_count(data_dir, "conversation_items")
            answer = http.post(f"/v1/conversations/{cid}/items", json={"items": messages(6)})
            refused(answer, "items", "LMSP_CONVERSATION_MAX_ITEMS")
            assert table_count(data_dir, "conversation_items") == before
            added = http.post(f"/v1/conversations/{cid}/items", json={"items": messages(5)})
            assert added.status_code == 200, added.text
            # a turn on the full conversation: refused before anything is stored
            responses = table_count(data_dir, "responses")
            turn = http.post(
                "/v1/responses", json={"model": TEST, "input": "more", "conversation": cid}
            )
            refused(turn, "conversation", "LMSP_CONVERSATION_MAX_ITEMS")
            assert table_count(data_dir, "responses") == responses
            # bytes: one conversation may hold 64 KiB of items
            held = table_count(data_dir, "conversations")
            big = http.post("/v1/conversations", json={"items": messages(1, 70_000)})
            refused(big, "items", "LMSP_CONVERSATION_MAX_BYTES")
            assert table_count(data_dir, "conversations") == held  # not even an empty one
            cid2 = http.post("/v1/conversations", json={"items": messages(2, 30_000)}).json()["id"]
            more = http.post(f"/v1/conversations/{cid2}/items", json={"items": messages(1, 30_000)})
            refused(more, "items", "LMSP_CONVERSATION_MAX_BYTES")
            # all of a client's conversations hold 100 KiB at most: 60 + 30 KB fit, 30 more not
            cid3 = http.post("/v1/conversations", json={"items": messages(1, 30_000)}).json()["id"]
            third = http.post(
                f"/v1/conversations/{cid3}/items", json={"items": messages(1, 30_000)}
            )
            refused(third, "items", "LMSP_CLIENT_CONVERSATION_BYTES")
            # another client's quota is its own
            with new_client(owner, "bystander") as other:
                mine = other.post("/v1/conversations", json={"items": messages(2, 30_000)})
                assert mine.status_code == 200, mine.text
            # deleting an item makes room again
            first = http.get(f"/v1/conversations/{cid2}/items", params={"limit": 1}).json()
            gone = http.delete(f"/v1/conversations/{cid2}/items/{first['data'][0]['id']}")
            assert gone.status_code == 200, gone.text
            again = http.post(
                f"/v1/conversations/{cid3}/items", json={"items": messages(1, 30_000)}
            )
            assert again.status_code == 200, again.text
        counts_agree(data_dir)
    finally:
        server.stop()


def test_unused_conversations_are_swept_with_their_turns(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # a step of the test engine takes 3 s: the running turn lasts over a minute
    env = {
        "LMSP_RETENTION": "2s",
        "LMSP_CONVERSATION_RETENTION": "2s",
        "LMSP_GC_INTERVAL": "1s",
        "LMSP_TEST_ENGINE_DELAY": "3",
    }
    server = Server(data_dir, env=env).start()
    try:
        with server.client() as http:
            done = http.post("/v1/conversations", json={"items": messages(3)}).json()["id"]
            turn = http.post(
                "/v1/responses",
                json={"model": TEST, "input": "hi", "conversation": done, "max_output_tokens": 1},
            ).json()
            assert turn["status"] in ("completed", "incomplete"), turn
            # a conversation whose turn is still running is in use: never swept meanwhile
            busy = http.post("/v1/conversations", json={"items": messages(3)}).json()["id"]
            running = http.post(
                "/v1/responses",
                json={"model": TEST, "input": "go on", "conversation": busy, "background": True},
            ).json()
            deadline = time.monotonic() + 120
            while http.get(f"/v1/conversations/{done}").status_code != 404:
                assert time.monotonic() < deadline, "the unused conversation was never swept"
                time.sleep(0.2)
            assert http.get(f"/v1/responses/{turn['id']}").status_code == 404
            assert http.get(f"/v1/responses/{running['id']}").json()["status"] in (
                "queued",
                "in_progress",
            )
            assert http.get(f"/v1/conversations/{busy}").status_code == 200
            conn = open_db(data_dir)
            left = "SELECT count(*) FROM conversation_items WHERE conversation_id = ?"
            assert conn.execute(left, (done,)).fetchone()[0] == 0
            assert conn.execute(left, (busy,)).fetchone()[0] == 3
            conn.close()
    finally:
        server.stop()


def corrupt(data_dir: Path, conversation: str, offset: int) -> None:
    """Make the conversation's item at ``offset`` (oldest first) unreadable: a reader
    that reaches it fails."""
    conn = sqlite3.connect(str(data_dir / "lmsp.db"), timeout=30)
    try:
        with conn:
            conn.execute(
                "UPDATE conversation_items SET item = '{unreadable' WHERE seq = (SELECT seq"
                " FROM conversation_items WHERE conversation_id = ? ORDER BY seq LIMIT 1"
                " OFFSET ?)",
                (conversation, offset),
            )
    finally:
        conn.close()


def test_a_turn_reads_only_the_newest_items_its_context_holds(tmp_path: Path) -> None:
    """400 items of 200 bytes against a context of 4,096: a turn reads the newest pages
    only (an old item it never reaches is made unreadable: a turn that read every item,
    as before, failed on it with a 500)."""
    data_dir = tmp_path / "data"
    server = Server(data_dir).start()
    try:
        with server.client() as http:
            cid = http.post("/v1/conversations", json={}).json()["id"]
            for batch in range(20):
                added = http.post(
                    f"/v1/conversations/{cid}/items",
                    json={"items": messages(20, 200, tag=f"b{batch}.")},
                )
                assert added.status_code == 200, added.text
            corrupt(data_dir, cid, 100)
            body = {"model": TEST, "conversation": cid, "truncation": "auto"}
            turn = http.post("/v1/responses", json={**body, "input": "next"})
            assert turn.status_code == 200, turn.text
            done = turn.json()
            assert done["status"] == "completed", done
            assert done["usage"]["input_tokens"] < 4096
            # the same in the background (the runner reads only the items it keeps)
            bg = http.post("/v1/responses", json={**body, "input": "later", "background": True})
            assert bg.status_code == 202, bg.text
            deadline = time.monotonic() + 120
            while (got := http.get(f"/v1/responses/{bg.json()['id']}").json())["status"] in (
                "queued",
                "in_progress",
            ):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert got["status"] == "completed", got
            # its input items, a page from the newest: its input, then the newest items
            page = http.get(f"/v1/responses/{done['id']}/input_items", params={"limit": 3})
            assert page.status_code == 200, page.text
            listed = page.json()
            assert listed["has_more"] and listed["data"][0]["content"][0]["text"] == "next"
            assert listed["data"][1]["content"][0]["text"].startswith("b19.19:")
            nxt = http.get(
                f"/v1/responses/{done['id']}/input_items",
                params={"limit": 3, "after": listed["last_id"]},
            ).json()
            assert nxt["data"][0]["content"][0]["text"].startswith("b19.17:")
            # without truncation the turn passes the context: refused, having read little
            whole = http.post(
                "/v1/responses", json={**body, "truncation": "disabled", "input": "x"}
            )
            assert whole.status_code == 400, whole.text
            assert whole.json()["error"]["code"] == "context_length_exceeded"
            # a count goes on to four contexts at most, then says "at least"
            counted = http.post(
                "/v1/responses/input_tokens",
                json={"model": TEST, "conversation": cid, "input": "x"},
            )
            assert counted.status_code == 400, counted.text
            assert "at least" in counted.json()["error"]["message"]
            # the conversation's own newest page reads as before
            items = http.get(f"/v1/conversations/{cid}/items", params={"limit": 5}).json()
            assert items["has_more"] and len(items["data"]) == 5
    finally:
        server.stop()
