"""Chat Completions on the Responses core: messages → input items, and the answers
rendered from a response object or its event log."""

from __future__ import annotations

from typing import Any

import pytest

from lmsp.protocol import chat
from lmsp.protocol import events as ev
from lmsp.protocol.assembler import OutputAssembler, TextDelta
from tests.openresponses import check_chunk, check_completion


def text_part(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


def test_messages_become_input_items() -> None:
    translated = chat.items_from_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "No lists."}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    )
    assert translated.items == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "No lists."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather?"}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": "It is sunny."},
    ]
    assert translated.origin == [0, 1, 2, 3, 4, 5]


def test_files_and_images_keep_their_responses_form() -> None:
    translated = chat.items_from_messages(
        [
            {
                "role": "user",
                "content": [
                    {"type": "file", "file": {"file_data": "aGk=", "filename": "a.txt"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                ],
            }
        ]
    )
    assert translated.items[0]["content"] == [
        {"type": "input_file", "file_data": "aGk=", "filename": "a.txt"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": None},
    ]


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ({"role": "user", "content": None}, "messages.0.content", "invalid_value"),
        ({"role": "assistant"}, "messages.0.content", "invalid_value"),
        ({"role": "tool", "content": "x"}, "messages.0.tool_call_id", "invalid_value"),
        ({"role": "function", "content": "x"}, "messages.0.role", "unsupported_input"),
        (
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            "messages.0.content.0",
            "unsupported_input",
        ),
        (
            {"role": "user", "content": [{"type": "text"}]},
            "messages.0.content.0.text",
            "invalid_value",
        ),
        (
            {"role": "user", "content": [{"type": "file"}]},
            "messages.0.content.0.file",
            "invalid_value",
        ),
    ],
)
def test_untranslatable_messages_name_their_place(
    message: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(chat.Untranslatable) as caught:
        chat.items_from_messages([message])
    assert caught.value.param == param
    assert caught.value.code == code


def finished(status: str = "completed", text: str = "Hi!") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "created_at": 1700000000,
        "model": "m",
        "status": status,
        "model_digest": "sha256:ab",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                ],
            }
        ],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 7,
        },
        "error": None,
    }


def test_a_finished_response_is_a_chat_completion() -> None:
    shown = chat.completion(finished())
    parsed = check_completion(shown)
    assert parsed.id == "resp_1" and parsed.object == "chat.completion"
    assert parsed.choices[0].message.content == "Hi!"
    assert parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.total_tokens == 7
    assert chat.completion(finished("incomplete"))["choices"][0]["finish_reason"] == "length"


def test_the_event_log_becomes_chunks() -> None:
    asm = OutputAssembler()
    log: list[dict[str, Any]] = [
        {"type": ev.CREATED, "response": {"model_digest": None}},
        {"type": ev.LOADING, "response": {}},
        {"type": ev.IN_PROGRESS, "response": {"model_digest": "sha256:ab"}},
        *asm.feed(TextDelta("Hi")),
        *asm.feed(TextDelta("!")),
        *asm.finish(),
        {"type": ev.COMPLETED, "response": finished()},
    ]
    stream = chat.ChunkStream("resp_1", 1700000000, "m", include_usage=True)
    chunks = [c for event in log for c in stream.feed(event)]
    for chunk in chunks:
        check_chunk(chunk)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hi!"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert all(c["system_fingerprint"] == "sha256:ab" for c in chunks)
    assert stream.ended


def test_a_failed_or_cancelled_response_streams_an_error() -> None:
    failed = {**finished("failed"), "error": {"code": "engine_error", "message": "boom"}}
    stream = chat.ChunkStream("resp_1", 1, "m")
    assert stream.feed({"type": ev.FAILED, "response": failed}) == [
        {"error": {"code": "engine_error", "message": "boom"}}
    ]
    assert chat.error_of(finished("cancelled"))["code"] == "cancelled"
