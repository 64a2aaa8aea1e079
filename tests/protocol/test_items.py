"""Input items: every kind normalized, rendered into chat messages, and every problem a
``400`` naming the item, part or field at fault."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest

from lmsp.errors import LmspError
from lmsp.protocol import filetext, items, itemtypes
from lmsp.protocol import request as stored
from lmsp.protocol.itemtypes import Items, typed
from tests.helpers import tiny_pdf


def ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def read_files(normalized: list[items.Item]) -> Items:
    """What the API does after normalizing (in a worker, under limits): the typed items
    with every file's text read once and kept with its part."""
    given = typed(normalized)
    texts = {}
    for where, part in items.files_of(given):
        place = f"input.{where}"
        raw, kind = items.file_bytes(part.file_data, part.filename, place)
        extracted = filetext.extract(raw, kind)
        if extracted.text is None:
            raise items.file_error(place, extracted)
        texts[where] = extracted.text
    return items.with_file_texts(given, texts)


def refused(given: Any) -> LmspError:
    with pytest.raises(LmspError) as caught:
        read_files(items.normalize(given, make_id=ids()))
    return caught.value


def test_a_string_is_one_user_message() -> None:
    assert items.normalize("hi", make_id=ids()) == [
        {
            "type": "message",
            "id": "msg_0",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
        }
    ]
    assert items.render(typed(items.normalize("hi")), "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_messages_with_and_without_type_every_role_and_part() -> None:
    given = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "S"}]},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "role": "assistant",
            "id": "msg_given",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "no", "annotations": [], "logprobs": []},
                {"type": "refusal", "refusal": " (refused)"},
            ],
        },
        {"role": "assistant", "content": "plain"},
    ]
    normalized = items.normalize(given, make_id=ids())
    assert [item["role"] for item in normalized] == [
        "developer",
        "system",
        "user",
        "assistant",
        "assistant",
    ]
    assert normalized[3]["id"] == "msg_given"
    assert normalized[4]["content"] == [
        {"type": "output_text", "text": "plain", "annotations": [], "logprobs": []}
    ]
    # normalizing again changes nothing (the store keeps normalized items)
    assert items.normalize(normalized, make_id=ids()) == normalized
    # and the typed items are that same JSON
    assert itemtypes.plain_all(typed(normalized)) == normalized
    assert items.render(typed(normalized)) == [
        {"role": "system", "content": "Rules."},
        {"role": "system", "content": "S"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "no (refused)"},
        {"role": "assistant", "content": "plain"},
    ]


def test_function_calls_and_outputs_render_as_tool_call_text() -> None:
    given = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "noon"}],
        },
    ]
    normalized = items.normalize(given, make_id=ids())
    assert normalized[2]["id"] == "fc_2" and normalized[4]["id"] == "fco_4"
    rendered = items.render(typed(normalized))
    assert [m["role"] for m in rendered] == ["user", "assistant", "user"]
    call = items.render_tool_call("weather", '{"city": "Paris"}')
    assert call == '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert rendered[1]["content"] == "\n".join(
        ["Let me look.", call, items.render_tool_call("time", "{}")]
    )
    assert rendered[2]["content"] == "<tool_response>\n18 C\n</tool_response>\n" + (
        "<tool_response>\nnoon\n</tool_response>"
    )
    # arguments that are not JSON are shown as given, as a string
    shown = items.render_tool_call("f", "{oops")
    assert shown == '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>'


@pytest.mark.parametrize(
    ("filename", "data_url", "content"),
    [
        ("notes.txt", False, b"The code is kumquat-7."),
        ("notes.md", True, b"# Title\n\nThe code is kumquat-7."),
        ("data.json", False, b'{"code": "kumquat-7"}'),
        ("table.csv", True, b"name,code\nx,kumquat-7\n"),
    ],
)
def test_text_files_reach_the_prompt(filename: str, data_url: bool, content: bytes) -> None:
    media = {"txt": "text/plain", "md": "text/markdown", "json": "application/json"}
    mime = media.get(filename.rsplit(".", 1)[1], "text/csv")
    data = f"data:{mime};base64,{b64(content)}" if data_url else b64(content)
    given = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Read this:"},
                {"type": "input_file", "filename": filename, "file_data": data},
            ],
        }
    ]
    normalized = items.normalize(given, make_id=ids())
    assert normalized[0]["content"][1] == {
        "type": "input_file",
        "filename": filename,
        "file_data": data,
    }
    read = read_files(normalized)  # the text is read once and kept with the part
    assert itemtypes.plain(read[0])["content"][1][items.FILE_TEXT] == content.decode()
    text = items.render(read)[0]["content"]
    assert text.startswith("Read this:\n\n[file: " + filename + "]\n")
    assert "kumquat-7" in text


def test_a_pdf_gives_its_text() -> None:
    pdf = tiny_pdf("The secret word is zanzibar.")
    given = [
        {
            "role": "user",
            "content": [
                {
                    "type": "input_file",
                    "filename": "doc.pdf",
                    "file_data": f"data:application/pdf;base64,{b64(pdf)}",
                }
            ],
        }
    ]
    normalized = items.normalize(given)
    read = read_files(normalized)
    assert "zanzibar" in itemtypes.plain(read[0])["content"][0][items.FILE_TEXT]
    text = items.render(read)[0]["content"]
    assert "The secret word is zanzibar." in text
    # a row stored before the text was kept with its part is read when rendered
    assert items.FILE_TEXT not in normalized[0]["content"][0]
    assert items.render(typed(normalized))[0]["content"] == text


def _file(filename: str, data: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "x"},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_file", "filename": filename, "file_data": data},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("given", "code", "param"),
    [
        (_file("photo.png", b64(b"\x89PNG")), "unsupported_input", "input.1.content.1"),
        (
            _file("a.exe", f"data:application/octet-stream;base64,{b64(b'MZ')}"),
            "unsupported_input",
            "input.1.content.1",
        ),
        (_file("a.txt", "not base64!!"), "invalid_value", "input.1.content.1.file_data"),
        (_file("a.txt", b64(b"\xff\xfe\x00bad")), "invalid_file", "input.1.content.1.file_data"),
        (_file("a.json", b64(b"{nope")), "invalid_file", "input.1.content.1.file_data"),
        (_file("a.json", b64(b"[" * 100_000)), "invalid_file", "input.1.content.1.file_data"),
        (_file("a.pdf", b64(b"%PDF-1.4 garbage")), "invalid_file", "input.1.content.1.file_data"),
        (_file("a.txt", b64(b"x" * 200_001)), "invalid_file", "input.1.content.1.file_data"),
        (_file("blank.pdf", b64(tiny_pdf(""))), "unsupported_input", "input.1.content.1.file_data"),
        (
            _file("a.txt", b64(b"x" * (items.MAX_FILE_BYTES + 1))),
            "invalid_value",
            "input.1.content.1.file_data",
        ),
        (_file("", b64(b"x")), "invalid_value", "input.1.content.1.filename"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "input_file", "file_id": "file_1", "filename": "a.txt"}],
                }
            ],
            "unsupported_input",
            "input.0.content.0.file_id",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}],
                }
            ],
            "unsupported_input",
            "input.0.content.0",
        ),
        (
            [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image", "image_url": "x"}],
                }
            ],
            "unsupported_input",
            "input.0.output.0",
        ),
        ([{"type": "reasoning", "summary": []}], "unsupported_input", "input.0.type"),
        ([{"type": "item_reference", "id": "msg_1"}], "unsupported_input", "input.0.type"),
        (
            [{"role": "user", "content": [{"type": "input_audio"}]}],
            "unsupported_input",
            "input.0.content.0.type",
        ),
        (
            [{"role": "user", "content": "hi", "name": "bob"}],
            "unsupported_parameter",
            "input.0.name",
        ),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "a", "x": 1}]}],
            "unsupported_parameter",
            "input.0.content.0.x",
        ),
        ([{"role": "wizard", "content": "hi"}], "invalid_value", "input.0.role"),
        ([{"role": "user", "content": []}], "invalid_value", "input.0.content"),
        (
            [{"role": "user", "content": [{"type": "input_text"}]}],
            "invalid_value",
            "input.0.content.0.text",
        ),
        (
            [{"type": "function_call", "call_id": "c", "name": "f"}],
            "invalid_value",
            "input.0.arguments",
        ),
        ([{"type": "function_call_output", "output": "x"}], "invalid_value", "input.0.call_id"),
        (["just a string"], "invalid_value", "input.0"),
        ([], "invalid_value", "input"),
    ],
)
def test_problems_are_named(given: Any, code: str, param: str) -> None:
    error = refused(given)
    assert (error.code, error.param) == (code, param), error.message
    assert error.message.startswith(param)


def test_images_name_the_capabilities() -> None:
    given = [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
    with pytest.raises(LmspError) as caught:
        items.normalize(given, capabilities=["completion"])
    assert "vision" in caught.value.message and "completion" in caught.value.message


def test_rows_stored_before_normalization_still_render() -> None:
    old = {
        "input": [
            {"role": "user", "content": [{"type": "text", "text": "a"}]},
            {"role": "assistant", "content": "b"},
        ]
    }
    assert items.render(stored.from_stored({"model": "m", **old}).input) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    assert items.render(stored.from_stored({"model": "m", "input": "hello"}).input) == [
        {"role": "user", "content": "hello"}
    ]
