"""``/v1/messages`` through the in-process app (deterministic test engine): each message
is a stored response with its task and event log; its answers and errors are in
Anthropic's shapes (checked with the official SDK's types); what lmsp cannot honour is
refused and writes nothing."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from tests.api.test_wire import counts, log_of, slow_client  # noqa: F401 (a fixture)
from tests.helpers import check_log_invariants

EVENT = TypeAdapter(RawMessageStreamEvent)
BODY: dict[str, Any] = {
    "model": "lmsp-test",
    "max_tokens": 100,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "hello there"}],
    "seed": 11,
}
#: what Claude Code 2.1 sends (``--bare --tools ""``), trimmed: every field and header kind
CLAUDE_CODE: dict[str, Any] = {
    "model": "lmsp-test",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>\nToday's date is 2026-12-03.\n"},
                {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ],
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197;"},
        {
            "type": "text",
            "text": "You are a Claude agent.",
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "tools": [],
    "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "session_id": "s"})},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "stream": True,
}
CLAUDE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-app": "cli",
}


def token_of(client: TestClient) -> str:
    return str(client.headers["Authorization"]).removeprefix("Bearer ")


def anthropic_error(answer: Any, status: int, kind: str) -> str:
    """An answer in Anthropic's error envelope; its message."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"type", "error", "request_id"}, body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind, body
    assert body["request_id"] == answer.headers["x-request-id"]
    return str(body["error"]["message"])


def sse_events(raw: bytes) -> list[tuple[str | None, str, dict[str, Any]]]:
    """``(id, event, data)`` of a Messages stream, its framing checked line by line."""
    assert b"\r" not in raw
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) in ({"event", "data"}, {"id", "event", "data"}), block
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"]
        if fields["event"] not in ("ping", "error"):
            EVENT.validate_python(data)
        out.append((fields.get("id"), fields["event"], data))
    return out


def streamed(client: TestClient, method: str, url: str, **kwargs: Any) -> list[Any]:
    with client.stream(method, url, **kwargs) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        return sse_events(answer.read())


def text_of(events: list[Any]) -> str:
    return "".join(
        data["delta"]["text"]
        for _, name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    )


def test_a_message_is_a_stored_response(client: TestClient) -> None:
    token = token_of(client)
    answer = client.post(
        "/v1/messages",
        json=BODY,
        headers={"Authorization": "", "x-api-key": token, "anthropic-version": "2023-06-01"},
    )
    assert answer.status_code == 200, answer.text
    message = answer.json()
    Message.model_validate(message)
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] == 24
    (block,) = message["content"]
    assert block["type"] == "text" and len(block["text"].split()) == 24
    # the same work, durable: its response, its task and its log
    response = client.get(f"/v1/responses/{message['id']}").json()
    assert response["status"] == "completed" and response["instructions"] == "Be brief."
    assert response["output"][0]["content"][0]["text"] == block["text"]
    assert response["usage"]["input_tokens"] == (
        message["usage"]["input_tokens"] + message["usage"]["cache_read_input_tokens"]
    )
    tasks = client.get("/v1/tasks").json()["data"]
    assert response["task"]["id"] in [t["id"] for t in tasks]
    assert log_of(client, response["task"]["id"])[-1]["type"] == "response.completed"
    # GET /v1/messages/{id} shows it again
    assert client.get(f"/v1/messages/{message['id']}").json() == message
    # the metrics count it by its route
    scraped = client.get("/metrics").text
    assert 'route="/v1/messages",status="200"' in scraped
    check_log_invariants(client.app.state.lmsp.db.reader())  # type: ignore[attr-defined]


def test_a_stream_and_following_it_again(client: TestClient) -> None:
    events = streamed(client, "POST", "/v1/messages", json={**BODY, "stream": True})
    names = [name for _, name, _ in events]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert 1 <= names.count("content_block_delta") <= 24  # a delta joins the tokens of a flush
    message_id = events[0][2]["message"]["id"]
    final = client.get(f"/v1/messages/{message_id}").json()
    assert text_of(events) == final["content"][0]["text"]
    assert events[-2][2]["delta"]["stop_reason"] == final["stop_reason"] == "end_turn"
    assert events[-2][2]["usage"]["output_tokens"] == final["usage"]["output_tokens"]
    # each id is the number of the log event it came from, and grows
    ids = [int(i) for i, _, _ in events if i is not None]
    assert ids == sorted(set(ids)) and ids[0] == 0
    task_id = client.get(f"/v1/responses/{message_id}").json()["task"]["id"]
    assert ids[-1] == log_of(client, task_id)[-1]["sequence_number"]
    # followed again: the same events; after a number, only what came after it
    again = streamed(client, "GET", f"/v1/messages/{message_id}", params={"stream": "true"})
    assert again == events
    cut = ids[len(ids) // 2]
    rest = streamed(
        client,
        "GET",
        f"/v1/messages/{message_id}",
        params={"stream": "true", "starting_after": cut},
    )
    position = next(i for i, (event_id, _, _) in enumerate(events) if event_id == str(cut))
    assert rest == events[position + 1 :]
    by_header = streamed(
        client,
        "GET",
        f"/v1/messages/{message_id}?stream=true",
        headers={"Last-Event-ID": str(cut)},
    )
    assert by_header == rest


def test_what_claude_code_sends_is_served(client: TestClient) -> None:
    events = streamed(
        client, "POST", "/v1/messages?beta=true", json=CLAUDE_CODE, headers=CLAUDE_HEADERS
    )
    assert events[-1][1] == "message_stop"
    message_id = events[0][2]["message"]["id"]
    response = client.get(f"/v1/responses/{message_id}").json()
    assert response["metadata"] == {"user_id": CLAUDE_CODE["metadata"]["user_id"]}
    assert response["instructions"].startswith("x-anthropic-billing-header")
    assert response["max_output_tokens"] == 32000
    counted = client.post(
        "/v1/messages/count_tokens",
        json={k: CLAUDE_CODE[k] for k in ("model", "messages", "system", "tools")},
        headers=CLAUDE_HEADERS,
    )
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": response["usage"]["input_tokens"]}


def test_count_tokens_counts_the_prompt_the_model_gets(client: TestClient) -> None:
    made = client.post("/v1/messages", json=BODY).json()
    used = made["usage"]["input_tokens"] + made["usage"]["cache_read_input_tokens"]
    plain = {k: BODY[k] for k in ("model", "system", "messages")}
    assert client.post("/v1/messages/count_tokens", json=plain).json() == {"input_tokens": used}
    tool = {
        "name": "weather",
        "description": "The weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    with_tools = client.post("/v1/messages/count_tokens", json={**plain, "tools": [tool]}).json()
    assert with_tools["input_tokens"] > used
    unshown = client.post(
        "/v1/messages/count_tokens",
        json={**plain, "tools": [tool], "tool_choice": {"type": "none"}},
    ).json()
    assert unshown == {"input_tokens": used}


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"output_config": {"effort": "low"}}, "output_config.effort"),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "edits"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"container": "c"}, "container"),
        ({"speed": "fast"}, "speed"),
        ({"colour": "red"}, "colour"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"service_tier": "priority"}, "service_tier"),
        ({"metadata": {"user_id": "u", "team": "x"}}, "metadata.team"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
            "messages.1",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AA==",
                                },
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0",
        ),
        (
            {
                "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                "stop_sequences": ["END"],
            },
            "stop_sequences",
        ),
        (
            {
                "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "v"},
            },
            "tool_choice.name",
        ),
        (
            {
                "tools": [
                    {
                        "name": "w",
                        "strict": True,  # not strict: checked after generation instead
                        "input_schema": {
                            "type": "object",
                            "properties": {
                                "m": {"type": "object", "propertyNames": {"pattern": "^a"}}
                            },
                        },
                    }
                ]
            },
            "tools.0.input_schema.properties.m.propertyNames",
        ),
    ],
)
def test_what_lmsp_cannot_honour_is_refused(
    client: TestClient, extra: dict[str, Any], where: str
) -> None:
    before = counts(client)
    message = anthropic_error(
        client.post("/v1/messages", json={**BODY, **extra}), 400, "invalid_request_error"
    )
    assert where in message, message
    assert counts(client) == before


def test_count_tokens_refuses_alike(client: TestClient) -> None:
    plain = {k: BODY[k] for k in ("model", "system", "messages")}
    for extra, where in [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"messages": [{"role": "assistant", "content": "y"}]}, "messages.0"),
        ({"tools": [{"name": "w", "input_schema": {"type": "string"}}]}, "tools.0.input_schema"),
        ({"max_tokens": 5}, "max_tokens"),
    ]:
        answer = client.post("/v1/messages/count_tokens", json={**plain, **extra})
        assert where in anthropic_error(answer, 400, "invalid_request_error")
    unknown = client.post("/v1/messages/count_tokens", json={**plain, "model": "nope"})
    anthropic_error(unknown, 404, "not_found_error")


def test_error_shapes(client: TestClient) -> None:
    token = token_of(client)
    message = anthropic_error(
        client.post("/v1/messages", json={**BODY, "model": "claude-sonnet-4-6"}),
        404,
        "not_found_error",
    )
    assert (
        "claude-sonnet-4-6" in message and "lmsp-test" in message and "ANTHROPIC_MODEL" in message
    )
    bad = {"Authorization": "", "x-api-key": token + "x"}
    anthropic_error(
        client.post("/v1/messages", json=BODY, headers=bad), 401, "authentication_error"
    )
    anthropic_error(
        client.post("/v1/messages", json=BODY, headers={"Authorization": ""}),
        401,
        "authentication_error",
    )
    reader = client.post("/v1/clients", json={"name": "r", "scopes": ["responses:read"]}).json()
    anthropic_error(
        client.post(
            "/v1/messages", json=BODY, headers={"Authorization": f"Bearer {reader['token']}"}
        ),
        403,
        "permission_error",
    )
    anthropic_error(client.get("/v1/messages/resp_nothing"), 404, "not_found_error")
    anthropic_error(client.get("/v1/messages/a/b/c"), 404, "not_found_error")
    anthropic_error(client.post("/v1/messages", content=b"{not json"), 400, "invalid_request_error")
    anthropic_error(client.post("/v1/messages", content=b"x" * (2 << 20)), 413, "request_too_large")
    anthropic_error(
        client.post("/v1/messages/count_tokens", json=BODY, headers={"Idempotency-Key": "k"}),
        400,
        "invalid_request_error",
    )
    failed = {**BODY, "messages": [{"role": "user", "content": "[engine-error] please"}]}
    anthropic_error(client.post("/v1/messages", json=failed), 500, "api_error")
    events = streamed(client, "POST", "/v1/messages", json={**failed, "stream": True})
    assert events[-1][1] == "error" and events[-1][2]["error"]["type"] == "api_error"
    # elsewhere errors keep section 8's shape
    other = client.post("/v1/responses", json={"model": "nope", "input": "x"}).json()
    assert set(other["error"]) == {"type", "code", "message", "param"}


def test_an_idempotency_key_replays_a_message(client: TestClient) -> None:
    headers = {"Idempotency-Key": "message-1"}
    first = client.post("/v1/messages", json=BODY, headers=headers)
    before = counts(client)
    again = client.post("/v1/messages", json=BODY, headers=headers)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert counts(client) == before
    changed = client.post("/v1/messages", json={**BODY, "max_tokens": 5}, headers=headers)
    anthropic_error(changed, 422, "invalid_request_error")
    streamed_once = streamed(
        client,
        "POST",
        "/v1/messages",
        json={**BODY, "stream": True},
        headers={"Idempotency-Key": "s"},
    )
    replayed = streamed(
        client,
        "POST",
        "/v1/messages",
        json={**BODY, "stream": True},
        headers={"Idempotency-Key": "s"},
    )
    assert replayed == streamed_once


def test_a_cancelled_message(slow_client: TestClient) -> None:  # noqa: F811 (the fixture)
    """Cancelled through ``lmsp tasks cancel``'s route while one client waits and another
    streams: the wait answers 409 that an SDK must not retry, the stream an error event."""
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(slow_client.post("/v1/messages", json=BODY)), daemon=True
    )
    waiting.start()
    deadline = time.monotonic() + 60
    while not (tasks := slow_client.get("/v1/tasks", params={"status": "running"}).json()["data"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # what `lmsp ps` and the console show: the message's task is generating
    activity = slow_client.get("/v1/service/activity").json()
    assert tasks[0]["id"] in [seq["task_id"] for seq in activity["sequences"]]
    follow: list[Any] = []
    response_id = tasks[0]["response_id"]
    following = threading.Thread(
        target=lambda: follow.append(
            streamed(slow_client, "GET", f"/v1/messages/{response_id}", params={"stream": "true"})
        ),
        daemon=True,
    )
    following.start()
    time.sleep(0.5)
    assert slow_client.post(f"/v1/tasks/{tasks[0]['id']}/cancel").status_code == 200
    waiting.join(60)
    following.join(60)
    (answer,) = answers
    anthropic_error(answer, 409, "invalid_request_error")
    assert answer.headers["x-should-retry"] == "false"
    assert follow[0][-1][1] == "error"
