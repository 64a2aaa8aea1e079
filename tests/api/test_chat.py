"""``POST /v1/chat/completions`` through the in-process app (deterministic test engine):
each completion is a stored response with its task and event log."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_wire import counts, log_of, raw_stream, text_of
from tests.helpers import check_log_invariants
from tests.openresponses import check_chunk, check_completion, check_event, check_object

CHAT: dict[str, Any] = {
    "model": "lmsp-test",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ],
    "seed": 11,
}


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    """A chat stream's chunks: ``data:`` lines only, ``\\n`` endings, ``[DONE]`` last."""
    assert b"\r" not in raw
    text = "".join(line for line in raw.decode().splitlines(True) if line != ": ping\n")
    blocks = [b for b in text.split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]"
    out = []
    for block in blocks[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block
        out.append(json.loads(block.removeprefix("data: ")))
    return out


def test_a_completion_is_a_stored_response(client: TestClient) -> None:
    answer = client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    completion = answer.json()
    parsed = check_completion(completion)
    assert parsed.object == "chat.completion" and parsed.model == "lmsp-test"
    choice = parsed.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.completion_tokens == 24
    # the same work, durable: the response, its task and its log
    response = client.get(f"/v1/responses/{completion['id']}").json()
    check_object(response)
    assert text_of(response) == choice.message.content
    assert parsed.usage.prompt_tokens == response["usage"]["input_tokens"]
    assert completion["system_fingerprint"] == response["model_digest"]
    log = log_of(client, response["task"]["id"])
    assert log[-1]["type"] == "response.completed"
    for event in log:
        check_event(event)
    # the messages were stored as Responses input items
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    row = (
        svc.db.reader()
        .execute("SELECT request FROM responses WHERE id = ?", (completion["id"],))
        .fetchone()
    )
    stored = json.loads(row[0])["input"]
    assert [(item["type"], item["role"], item["content"]) for item in stored] == [
        ("message", "system", [{"type": "input_text", "text": "Be brief."}]),
        ("message", "user", [{"type": "input_text", "text": "hello there"}]),
    ]
    assert all(item["id"].startswith("msg_") for item in stored)


def test_the_same_seed_gives_the_same_answer_as_responses(client: TestClient) -> None:
    chat = client.post("/v1/chat/completions", json=CHAT).json()
    response = client.post(
        "/v1/responses",
        json={
            "model": "lmsp-test",
            "instructions": "Be brief.",
            "input": "hello there",
            "seed": 11,
        },
    ).json()
    assert chat["choices"][0]["message"]["content"] == text_of(response)


def test_max_tokens_and_stop(client: TestClient) -> None:
    short = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}).json()
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 5
    newer = client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 5}).json()
    assert newer["choices"][0]["message"] == short["choices"][0]["message"]
    whole = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    words = whole["content"].split(" ")
    stopped = client.post("/v1/chat/completions", json={**CHAT, "stop": words[3]}).json()
    assert stopped["choices"][0]["message"]["content"] == whole["content"].split(words[3])[0]
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_temperature_and_seed_are_honoured(client: TestClient) -> None:
    first = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.8}).json()
    again = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.8}).json()
    other = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.8, "seed": 12})
    text = first["choices"][0]["message"]["content"]
    assert text == again["choices"][0]["message"]["content"]
    assert text != other.json()["choices"][0]["message"]["content"]
    stored = client.get(f"/v1/responses/{first['id']}").json()
    assert stored["temperature"] == 0.8 and stored["top_p"] == 1.0


def test_a_stream_with_usage(client: TestClient) -> None:
    raw = raw_stream(
        client,
        "POST",
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = chunks_of(raw)
    for chunk in chunks:
        check_chunk(chunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1
    stored = client.get(f"/v1/responses/{chunks[0]['id']}").json()
    assert text == text_of(stored)
    plain = chunks_of(
        raw_stream(client, "POST", "/v1/chat/completions", json={**CHAT, "stream": True})
    )
    assert all("usage" not in c for c in plain)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in plain) == text


def test_a_failed_completion_is_an_error(client: TestClient) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "[engine-error]"}]}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "engine_error"
    assert answer.json()["error"]["type"] == "server_error"
    chunks = chunks_of(
        raw_stream(client, "POST", "/v1/chat/completions", json={**body, "stream": True})
    )
    assert chunks[-1]["error"]["code"] == "engine_error"


def test_idempotency_keys_are_honoured(client: TestClient) -> None:
    headers = {"Idempotency-Key": "chat-1"}
    first = client.post("/v1/chat/completions", json=CHAT, headers=headers)
    again = client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert counts(client)["responses"] == 1
    reused = client.post("/v1/chat/completions", json={**CHAT, "seed": 3}, headers=headers)
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"


def test_store_false_keeps_nothing(client: TestClient) -> None:
    answer = client.post("/v1/chat/completions", json={**CHAT, "store": False}).json()
    assert answer["choices"][0]["message"]["content"]
    assert counts(client)["responses"] == 0


BAD: list[tuple[dict[str, Any], int, str, str]] = [
    ({"messages": []}, 400, "invalid_value", "messages"),
    ({"n": 3}, 400, "unsupported_parameter", "n"),
    ({"n": 0}, 400, "invalid_value", "n"),
    ({"model": "no-such-model"}, 404, "model_not_found", "model"),
    ({"tools": [{"type": "mcp"}]}, 400, "unsupported_parameter", "tools.0.type"),
    ({"tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,  # not strict, the keyword is checked after generation
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"type": "array", "uniqueItems": True}},
                        },
                    },
                }
            ]
        },
        400,
        "unsupported_schema",
        "tools.0.function.parameters.properties.x.uniqueItems",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "invalid_value",
        "tool_choice.function.name",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "auto", "tools": [{"type": "custom", "custom": {}}]},
            },
        },
        400,
        "unsupported_parameter",
        "tool_choice.allowed_tools.tools.0.type",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        400,
        "invalid_value",
        "response_format.json_schema.schema",
    ),
    ({"logprobs": True}, 400, "unsupported_parameter", "logprobs"),
    ({"logit_bias": {"42": 5}}, 400, "unsupported_parameter", "logit_bias"),
    ({"audio": {"voice": "alloy"}}, 400, "unsupported_parameter", "audio"),
    ({"modalities": ["text", "audio"]}, 400, "unsupported_parameter", "modalities"),
    ({"stream_options": {"include_usage": True}}, 400, "invalid_value", "stream_options"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, 400, "invalid_value", "max_tokens"),
    ({"temperature": 3}, 400, "invalid_value", "temperature"),
    ({"stop": ["a"] * 5}, 400, "invalid_value", "stop"),
    (
        {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
        400,
        "unsupported_parameter",
        "messages.0.name",
    ),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value", "messages.0.role"),
    ({"messages": [{"role": "user"}]}, 400, "invalid_value", "messages.0.content"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}],
                }
            ]
        },
        400,
        "unsupported_input",
        "messages.0.content.0",
    ),
]


@pytest.mark.parametrize(("change", "status", "code", "param"), BAD)
def test_bad_bodies_get_section_8_errors_and_write_nothing(
    client: TestClient, change: dict[str, Any], status: int, code: str, param: str
) -> None:
    before = counts(client)
    answer = client.post(
        "/v1/chat/completions", json={**CHAT, **change}, headers={"Idempotency-Key": "bad"}
    )
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert counts(client) == before
    check_log_invariants(client.app.state.lmsp.db.reader())  # type: ignore[attr-defined]
