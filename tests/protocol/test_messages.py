"""The Messages API on the Responses core (pure): messages → input items, tools, and the
answers rendered from a response object or its event log, checked against the official
``anthropic`` SDK's own types."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from lmsp.protocol import events as ev
from lmsp.protocol import message_events, messages
from lmsp.protocol.assembler import OutputAssembler, TextDelta
from lmsp.protocol.chat import Untranslatable
from lmsp.protocol.toolcalls import CallAssembler

EVENT = TypeAdapter(RawMessageStreamEvent)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_messages_become_input_items() -> None:
    translated = messages.items_from_messages(
        [
            user("Weather in Oslo?"),
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "tu_1",
                        "name": "weather",
                        "input": {"city": "Oslo"},
                    },
                    {"type": "tool_use", "id": "tu_2", "name": "weather", "input": {"city": "X"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu_2",
                        "content": [{"type": "text", "text": "no such city"}],
                        "is_error": True,
                    },
                    {
                        "type": "text",
                        "text": "And tomorrow?",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            user("Thanks."),
        ]
    )
    assert translated.items == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Oslo?"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me look."}],
        },
        {
            "type": "function_call",
            "call_id": "tu_1",
            "name": "weather",
            "arguments": '{"city": "Oslo"}',
        },
        {
            "type": "function_call",
            "call_id": "tu_2",
            "name": "weather",
            "arguments": '{"city": "X"}',
        },
        {"type": "function_call_output", "call_id": "tu_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "tu_2", "output": "Error: no such city"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "And tomorrow?"}],
        },
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
    ]
    assert translated.origin == [0, 1, 1, 1, 2, 2, 2, 3, 4]


def test_system_and_documents() -> None:
    assert messages.system_text("Be brief.") == "Be brief."
    assert (
        messages.system_text([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])
        == "A\nB"
    )
    assert messages.system_text(None) is None
    translated = messages.items_from_messages(
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "hello"},
                        "title": "notes",
                    },
                    {"type": "text", "text": "Summarise."},
                ],
            }
        ]
    )
    (item,) = translated.items
    part = item["content"][0]
    assert part["type"] == "input_file" and part["filename"] == "notes.txt"
    assert base64.b64decode(part["file_data"].split(",", 1)[1]) == b"hello"


@pytest.mark.parametrize(
    ("given", "param", "code"),
    [
        ([{"role": "assistant", "content": "prefill"}], "messages.0", "unsupported_input"),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            "messages.0.content.0",
            "unsupported_input",
        ),
        (
            [
                user("x"),
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]},
                user("y"),
            ],
            "messages.1.content.0.type",
            "unsupported_input",
        ),
        (
            [{"role": "user", "content": [{"type": "web_search_tool_result"}]}],
            "messages.0.content.0.type",
            "unsupported_input",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}],
            "messages.0.content.0.colour",
            "invalid_value",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}],
                }
            ],
            "messages.0.content.0.type",
            "invalid_value",
        ),
        ([{"role": "user", "content": []}], "messages.0.content", "invalid_value"),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}],
            "messages.0.content.0.tool_use_id",
            "invalid_value",
        ),
    ],
)
def test_what_has_no_translation_is_refused_by_name(
    given: list[dict[str, Any]], param: str, code: str
) -> None:
    with pytest.raises(Untranslatable) as caught:
        messages.items_from_messages(given)
    assert caught.value.param == param and caught.value.code == code


def test_tools_and_tool_choice() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = messages.function_tools(
        [
            {"name": "weather", "description": "Weather.", "input_schema": schema},
            {"type": "custom", "name": "time", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ]
    )
    # Anthropic's tools are not strict unless they say so (docs/tools.md: a keyword a
    # grammar cannot enforce is then checked after generation)
    assert tools == [
        {
            "type": "function",
            "name": "weather",
            "parameters": schema,
            "strict": False,
            "description": "Weather.",
        },
        {"type": "function", "name": "time", "parameters": {"type": "object"}, "strict": False},
        {"type": "web_search_20250305"},
    ]
    assert messages.tool_choice(None) == (None, None)
    assert messages.tool_choice({"type": "auto"}) == ("auto", None)
    assert messages.tool_choice({"type": "any", "disable_parallel_tool_use": True}) == (
        "required",
        False,
    )
    assert messages.tool_choice({"type": "tool", "name": "weather"}) == (
        {"type": "function", "name": "weather"},
        None,
    )
    assert messages.tool_choice({"type": "none"}) == ("none", None)
    assert messages.tools_param("tools", 0, "parameters", "x") == "tools.0.input_schema.x"
    assert messages.tools_param("text", "format", "schema") == "output_config.format.schema"
    assert messages.tools_param("stop") == "stop_sequences"
    with pytest.raises(Untranslatable) as caught:
        messages.function_tools([{"name": "w", "input_schema": {}, "defer_loading": True}])
    assert caught.value.param == "tools.0.defer_loading"


def response(status: str, output: list[dict[str, Any]], **usage: int) -> dict[str, Any]:
    used = {"input_tokens": 40, "cached_tokens": 0, "output_tokens": 7, **usage}
    return {
        "id": "resp_1",
        "model": "m",
        "status": status,
        "output": output,
        "max_output_tokens": 100,
        "usage": {
            "input_tokens": used["input_tokens"],
            "input_tokens_details": {"cached_tokens": used["cached_tokens"]},
            "output_tokens": used["output_tokens"],
            "total_tokens": used["input_tokens"] + used["output_tokens"],
        },
    }


TEXT = {"type": "message", "content": [{"type": "output_text", "text": "Hi."}]}
EMPTY = {"type": "message", "content": [{"type": "output_text", "text": ""}]}
CALL = {
    "type": "function_call",
    "call_id": "c1",
    "name": "weather",
    "arguments": '{"city": "Oslo"}',
}


def test_the_message_object() -> None:
    shown = messages.message(response("completed", [EMPTY, TEXT], cached_tokens=30))
    Message.model_validate(shown)
    assert shown["content"] == [{"type": "text", "text": "Hi."}]
    assert shown["stop_reason"] == "end_turn" and shown["stop_sequence"] is None
    assert shown["usage"]["input_tokens"] == 10 and shown["usage"]["cache_read_input_tokens"] == 30
    called = messages.message(response("completed", [CALL]))
    assert called["stop_reason"] == "tool_use"
    assert called["content"] == [
        {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}}
    ]
    stopped = messages.message(response("completed", [TEXT]), "END")
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == "END"
    assert messages.message(response("incomplete", [TEXT], output_tokens=100))["stop_reason"] == (
        "max_tokens"
    )
    full = messages.message(response("incomplete", [TEXT], output_tokens=60))
    assert full["stop_reason"] == "model_context_window_exceeded"
    cut = dict(CALL, arguments='{"city": "Os')
    assert (
        messages.message(response("incomplete", [cut], output_tokens=100))["content"][0]["input"]
        == {}
    )
    assert messages.message(response("in_progress", [TEXT]))["stop_reason"] is None


def logged_text(pieces: list[str], stop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    asm = OutputAssembler(stop=stop)
    out: list[dict[str, Any]] = [{"type": ev.CREATED, "response": {}}]
    for piece in pieces:
        out += asm.feed(TextDelta(piece))
        if asm.stopped:
            break
    out += asm.finish()
    return out


def stream_of(logged: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    translator = message_events.MessageEvents("resp_1", "m")
    out = [pair for event in logged for pair in translator.feed(event)]
    for name, payload in out:
        assert payload["type"] == name
        if name != "error":
            EVENT.validate_python(payload)
    return out


def test_a_text_stream() -> None:
    final = response("completed", [TEXT])
    out = stream_of(
        [
            *logged_text(["Hi", ".", " There"], stop=(" Th",)),
            {"type": ev.COMPLETED, "response": final},
        ]
    )
    names = [name for name, _ in out]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(p["delta"]["text"] for n, p in out if n == "content_block_delta") == "Hi."
    delta = out[-2][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": " Th"}
    assert delta["usage"]["output_tokens"] == 7


def test_the_assembler_notes_the_stop_sequence() -> None:
    logged = logged_text(["one two", " three"], stop=("x", " thr", "tw"))
    assert messages.stop_sequence_of(logged) == "tw"
    assert messages.stop_sequence_of(logged_text(["one"], stop=("x",))) is None


def test_a_tool_stream_and_an_empty_message() -> None:
    asm = CallAssembler(callable_names=("weather",))
    logged: list[dict[str, Any]] = [{"type": ev.CREATED, "response": {}}]
    logged += asm.feed(TextDelta('<tool_call>{"name": "weather", "arguments": {"city": '))
    logged += asm.feed(TextDelta('"Oslo"}}</tool_call>'))
    logged += asm.finish()
    final = response("completed", asm.items)
    out = stream_of([*logged, {"type": ev.COMPLETED, "response": final}])
    names = [name for name, _ in out]
    assert names[:2] == ["message_start", "content_block_start"]
    start = out[1][1]["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "weather" and start["input"] == {}
    partial = "".join(p["delta"]["partial_json"] for n, p in out if n == "content_block_delta")
    assert partial == '{"city": "Oslo"}'
    assert out[-2][1]["delta"]["stop_reason"] == "tool_use"
    empty = stream_of(
        [*logged_text([]), {"type": ev.COMPLETED, "response": response("completed", [EMPTY])}]
    )
    assert [n for n, _ in empty] == ["message_start", "message_delta", "message_stop"]


def test_failures_and_resets() -> None:
    failed = {"status": "failed", "error": {"code": "engine_error", "message": "boom"}}
    out = stream_of([*logged_text(["Hi"])[:3], {"type": ev.FAILED, "response": failed}])
    assert out[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "boom"}},
    )
    cancelled = stream_of([{"type": ev.CANCELLED, "response": {"status": "cancelled"}}])
    assert cancelled[-1][0] == "error"
    # a reset before any block: nothing was shown, the stream goes on
    before = [*logged_text([])[:1], {"type": ev.QUEUED, "reset": True, "response": {}}]
    fine = stream_of(
        [
            *before,
            *logged_text(["Hi."])[1:],
            {"type": ev.COMPLETED, "response": response("completed", [TEXT])},
        ]
    )
    assert fine[-1][0] == "message_stop"
    # after a block: the stream ends with an error saying how to follow it again
    after = [*logged_text(["Hi"]), {"type": ev.QUEUED, "reset": True, "response": {}}]
    ended = stream_of([*after, *logged_text(["Other."])[1:]])
    assert ended[-1][0] == "error" and "GET /v1/messages/resp_1?stream=true" in str(ended[-1][1])


@pytest.mark.parametrize(
    ("results", "message"),
    [
        (["tu_9"], "unexpected tool_use_id 'tu_9'"),
        (["tu_1", "tu_1"], "answered twice"),
    ],
)
def test_a_tool_result_answers_a_tool_use_of_the_message_before_once(
    results: list[str], message: str
) -> None:
    """As Anthropic refuses them: an unknown ``tool_use_id``, or one answered twice."""
    asked = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "tu_1", "name": "weather", "input": {}}],
    }
    answers = [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in results]
    with pytest.raises(Untranslatable) as caught:
        messages.items_from_messages([user("?"), asked, {"role": "user", "content": answers}])
    assert message in str(caught.value)
    assert caught.value.param == f"messages.2.content.{len(results) - 1}.tool_use_id"


@pytest.mark.parametrize("across", [False, True])
def test_a_tool_use_id_is_unique_in_the_request(across: bool) -> None:
    """As Anthropic (``tool_use`` ids must be unique): twice in one assistant message,
    or in two, is refused naming the second."""
    use = {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {}}
    answer = {"type": "tool_result", "tool_use_id": "tu_1", "content": "ok"}
    if across:
        given = [
            user("?"),
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [answer]},
            {"role": "assistant", "content": [{**use, "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [answer]},
        ]
        where, first = "messages.3.content.0.id", "messages.1.content.0"
    else:
        given = [
            user("?"),
            {"role": "assistant", "content": [use, use]},
            {"role": "user", "content": [answer]},
        ]
        where, first = "messages.1.content.1.id", "messages.1.content.0"
    with pytest.raises(Untranslatable) as caught:
        messages.items_from_messages(given)
    assert caught.value.param == where
    assert "ids must be unique" in str(caught.value) and first in str(caught.value)
