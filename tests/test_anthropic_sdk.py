"""The official ``anthropic`` SDK, unchanged, against a real ``lmsp serve`` running the
real model: create, stream (``text_stream``, ``get_final_message``), a forced tool on
several seeds and a ``tool_result`` round trip, stop sequences, ``count_tokens``, error
shapes, an ``Idempotency-Key`` replay, and following a message again by its id.

One server (and one model load) for the module; the sampling values the Messages API
does not name (``seed``, and ``temperature`` which newer SDKs no longer list) go in
``extra_body``, as an SDK user would send them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from jsonschema import validate

from tests.helpers import Server, check_log_invariants, open_db, served

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0, "seed": 1}
HELLO: Any = [{"role": "user", "content": "Say hello to Ada."}]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL: Any = {
    "name": "get_weather",
    "description": "The current weather of a city.",
    "input_schema": SCHEMA,
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served(tmp_path_factory.mktemp("anthropic-sdk") / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[anthropic.Anthropic]:
    # no retries: an error answer must surface, not be papered over
    with anthropic.Anthropic(
        base_url=server.url, api_key=server.token, max_retries=0, timeout=600
    ) as client:
        yield client


def test_create(sdk: anthropic.Anthropic, server: Server) -> None:
    message = sdk.messages.create(model=MODEL, max_tokens=40, messages=HELLO, extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason in ("end_turn", "max_tokens")
    (block,) = message.content
    assert block.type == "text" and block.text.strip()
    used = message.usage
    assert used.input_tokens + (used.cache_read_input_tokens or 0) > 10
    assert 1 <= used.output_tokens <= 40
    # durable: the message is a response with its task, listed like any other
    with server.client() as http:
        response = http.get(f"/v1/responses/{message.id}").json()
        assert response["status"] in ("completed", "incomplete")
        assert response["output"][0]["content"][0]["text"] == block.text
        tasks = http.get("/v1/tasks").json()["data"]
        assert response["task"]["id"] in [t["id"] for t in tasks]


def test_stream_adds_up_to_the_final_message(sdk: anthropic.Anthropic) -> None:
    whole = sdk.messages.create(model=MODEL, max_tokens=40, messages=HELLO, extra_body=GREEDY)
    with sdk.messages.stream(
        model=MODEL, max_tokens=40, messages=HELLO, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert whole.content[0].type == "text" and text == whole.content[0].text  # greedy: the same
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_forced_tool_gives_valid_input(sdk: anthropic.Anthropic, seed: int) -> None:
    message = sdk.messages.create(
        model=MODEL,
        max_tokens=80,
        messages=QUESTION,
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        extra_body={"seed": seed},
    )
    assert message.stop_reason == "tool_use"
    (call,) = message.content  # forced, one call: nothing else
    assert call.type == "tool_use" and call.name == "get_weather"
    validate(call.input, SCHEMA)


def test_a_streamed_tool_call_and_its_result(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=80,
        messages=QUESTION,
        tools=[TOOL],
        tool_choice={"type": "any"},
        extra_body={"seed": 7},
    ) as stream:
        partial: dict[int, str] = {}
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial[event.index] = partial.get(event.index, "") + event.delta.partial_json
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    calls = [block for block in final.content if block.type == "tool_use"]
    assert calls and len(calls) == len(final.content)
    for index, call in enumerate(final.content):
        assert call.type == "tool_use"
        validate(call.input, SCHEMA)
        assert json.loads(partial[index]) == call.input
    call = calls[0]
    assert call.type == "tool_use"
    answer = sdk.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=[
            *QUESTION,
            {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}
                ],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]


def test_stop_sequences(sdk: anthropic.Anthropic) -> None:
    whole = sdk.messages.create(model=MODEL, max_tokens=40, messages=HELLO, extra_body=GREEDY)
    assert whole.content[0].type == "text"
    text = whole.content[0].text
    words = text.split()
    # a word that first shows up after a few others: greedy decoding stops right before it
    at = next(i for i in range(2, len(words)) if words[i] not in " ".join(words[:i]))
    stop = words[at]
    stopped = sdk.messages.create(
        model=MODEL, max_tokens=40, messages=HELLO, stop_sequences=["zzz", stop], extra_body=GREEDY
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].type == "text"
    assert stopped.content[0].text == text[: text.index(stop)]
    with sdk.messages.stream(
        model=MODEL, max_tokens=40, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text[: text.index(stop)]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_count_tokens(sdk: anthropic.Anthropic) -> None:
    made = sdk.messages.create(
        model=MODEL, max_tokens=5, system="Answer in French.", messages=HELLO, extra_body=GREEDY
    )
    counted = sdk.messages.count_tokens(model=MODEL, system="Answer in French.", messages=HELLO)
    assert counted.input_tokens == made.usage.input_tokens + (
        made.usage.cache_read_input_tokens or 0
    )
    with_tool = sdk.messages.count_tokens(model=MODEL, messages=QUESTION, tools=[TOOL])
    without = sdk.messages.count_tokens(model=MODEL, messages=QUESTION)
    assert with_tool.input_tokens > without.input_tokens


def test_error_shapes(sdk: anthropic.Anthropic, server: Server) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(model="claude-sonnet-4-6", max_tokens=5, messages=HELLO)
    assert missing.value.status_code == 404
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "error"
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert MODEL in missing.value.body["error"]["message"]
    with (
        anthropic.Anthropic(base_url=server.url, api_key="lmsp_wrong", max_retries=0) as wrong,
        pytest.raises(anthropic.AuthenticationError) as unauthorized,
    ):
        wrong.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    assert isinstance(unauthorized.value.body, dict)
    assert unauthorized.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model=MODEL, max_tokens=5, messages=[])
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages" in bad.value.body["error"]["message"]
    # x-api-key, as older SDKs and Claude Code with ANTHROPIC_API_KEY send the token
    answer = httpx.post(
        f"{server.url}/v1/messages",
        headers={"x-api-key": server.token, "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 3, "messages": HELLO},
        timeout=120,
    )
    assert answer.status_code == 200 and answer.json()["type"] == "message"


def test_an_idempotency_key_replays_a_message(sdk: anthropic.Anthropic, server: Server) -> None:
    key = {"Idempotency-Key": "anthropic-sdk-replay"}
    first = sdk.messages.with_raw_response.create(
        model=MODEL, max_tokens=20, messages=HELLO, extra_headers=key
    )
    again = sdk.messages.with_raw_response.create(
        model=MODEL, max_tokens=20, messages=HELLO, extra_headers=key
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().model_dump() == first.parse().model_dump()
    conn = open_db(server.data_dir)
    try:
        made = conn.execute(
            "SELECT count(*) FROM responses WHERE id = ?", (first.parse().id,)
        ).fetchone()[0]
        assert made == 1
        check_log_invariants(conn)
    finally:
        conn.close()


def test_a_message_is_followed_again_by_its_id(sdk: anthropic.Anthropic) -> None:
    """What a client whose stream broke does: ``GET /v1/messages/{id}?stream=true``,
    read with the SDK's own stream classes, adds up to the same message."""
    with sdk.messages.stream(
        model=MODEL, max_tokens=30, messages=HELLO, extra_body=GREEDY
    ) as stream:
        first = stream.get_final_message()
    events = sdk.get(
        f"/v1/messages/{first.id}",
        options={"params": {"stream": "true"}},
        cast_to=RawMessageStreamEvent,  # type: ignore[arg-type]
        stream=True,
        stream_cls=anthropic.Stream[RawMessageStreamEvent],
    )
    kinds, text, reason = [], "", None
    for event in events:
        kinds.append(event.type)
        if event.type == "message_start":
            assert event.message.id == first.id
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
        elif event.type == "message_delta":
            reason = event.delta.stop_reason
            assert event.usage.output_tokens == first.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert first.content[0].type == "text" and text == first.content[0].text
    assert reason == first.stop_reason
