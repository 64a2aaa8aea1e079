"""Conversations and input items through a real server and the real model (SmolLM2):
a three-turn ``previous_response_id`` chain with ``kill -9`` between the turns, and
every input item kind, files included, reaching the prompt."""

from __future__ import annotations

import base64
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
