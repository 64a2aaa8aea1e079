"""Schemas and tool calls as grammars (no model): refusals name the keyword's place,
the tool-call grammars compile, and the call assembler reads calls out of text however
the text is split and wherever a snapshot cut it."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from llguidance import LLMatcher

from lmsp.constraints import grammar
from lmsp.protocol import events as ev
from lmsp.protocol.assembler import TextDelta
from lmsp.protocol.toolcalls import CallAssembler, render_call

UNSUPPORTED: list[tuple[dict[str, Any], str | None]] = [
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    (
        {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        "properties.a.uniqueItems",
    ),
    ({"anyOf": [{"type": "string"}, {"not": {"type": "integer"}}]}, "anyOf.1.not"),
    ({"type": "string", "format": "no-such-format"}, "format"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {}}, None),
]


@pytest.mark.parametrize(("schema", "path"), UNSUPPORTED)
def test_an_unenforceable_keyword_is_named_with_its_path(
    schema: dict[str, Any], path: str | None
) -> None:
    with pytest.raises(grammar.UnsupportedSchema) as caught:
        grammar.check_schema(schema)
    if path is not None:
        assert caught.value.path == path
    assert caught.value.message


SUPPORTED: list[dict[str, Any]] = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}},
    {"type": "string", "format": "date"},
    {"type": "string", "pattern": "^[a-z]{2,4}$"},
    {"enum": ["a", "b", 3]},
    {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "number"}]},
    {"$defs": {"p": {"type": "boolean"}}, "type": "array", "items": {"$ref": "#/$defs/p"}},
]


@pytest.mark.parametrize("schema", SUPPORTED)
def test_the_supported_subset_compiles(schema: dict[str, Any]) -> None:
    compiled = grammar.check_schema(schema)
    assert LLMatcher.validate_grammar(compiled) == ""


def test_schemas_are_compiled_once() -> None:
    schema = {"type": "object", "properties": {"k": {"type": "string"}}}
    first = grammar.check_schema(schema)
    before = grammar._schema_grammar.cache_info().hits
    assert grammar.check_schema(json.loads(json.dumps(schema))) == first
    assert grammar._schema_grammar.cache_info().hits == before + 1


FUNCTIONS = [
    grammar.Function("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
    grammar.Function("add", {"type": "object", "properties": {"a": {"type": "integer"}}}),
]


@pytest.mark.parametrize(
    ("required", "limit", "schema"),
    [
        (True, None, None),
        (True, 1, None),
        (True, 3, None),
        (False, None, None),
        (False, 1, None),
        (False, 2, None),
        (False, None, {"type": "object"}),
    ],
)
def test_tool_call_grammars_compile(
    required: bool, limit: int | None, schema: dict[str, Any] | None
) -> None:
    compiled = grammar.calls_grammar(FUNCTIONS, required=required, limit=limit, text_schema=schema)
    assert LLMatcher.validate_grammar(compiled) == ""


# -- the call assembler ---------------------------------------------------------------------
TEXT = (
    "Let me look. "
    + render_call("get_weather", '{"city": "Paris }</tool_call> \\"x\\"", "n": [1, {"k": 2}]}')
    + "\n"
    + render_call("add", '{"a": 1}')
    + " <tool done."
)


def counter() -> Any:
    numbers = itertools.count()
    return lambda prefix: f"{prefix}_{next(numbers)}"


#: the functions the grammar of these texts offers
NAMES = ("get_weather", "add")


def run(
    chunks: list[str], names: tuple[str, ...] = NAMES
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    asm = CallAssembler(counter(), callable_names=names)
    events: list[dict[str, Any]] = []
    for chunk in chunks:
        events += asm.feed(TextDelta(chunk))
    events += asm.finish()
    return asm.items, events


def test_calls_are_read_out_of_the_text() -> None:
    items, events = run([TEXT])
    assert [item["type"] for item in items] == [
        "message",
        "function_call",
        "function_call",
        "message",
    ]
    assert items[0]["content"][0]["text"] == "Let me look. "
    assert items[1]["name"] == "get_weather"
    assert json.loads(items[1]["arguments"])["city"] == 'Paris }</tool_call> "x"'
    assert items[2]["name"] == "add" and items[2]["arguments"] == '{"a": 1}'
    assert items[3]["content"][0]["text"] == " <tool done."
    assert all(item["status"] == "completed" for item in items)
    for index in (1, 2):  # the deltas of a call are its arguments
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == ev.FUNCTION_CALL_ARGUMENTS_DELTA and e["output_index"] == index
        ]
        done = [e for e in events if e["type"] == ev.FUNCTION_CALL_ARGUMENTS_DONE]
        assert "".join(deltas) == done[index - 1]["arguments"] == items[index]["arguments"]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 13])
def test_any_split_of_the_text_gives_the_same_items(size: int) -> None:
    whole, _ = run([TEXT])
    pieces = [TEXT[i : i + size] for i in range(0, len(TEXT), size)]
    split, _ = run(pieces)
    assert split == whole


def test_a_replay_from_any_cut_continues_identically() -> None:
    whole, _ = run([TEXT])
    for cut in range(0, len(TEXT) + 1, 3):
        make_id = counter()
        asm = CallAssembler(make_id, callable_names=NAMES)
        logged = []
        for char in TEXT[:cut]:
            logged += asm.feed(TextDelta(char))
        resumed = CallAssembler.replay(logged, make_id, held=asm.held)
        resumed.callable = frozenset(NAMES)
        rest = []
        for char in TEXT[cut:]:
            rest += resumed.feed(TextDelta(char))
        rest += resumed.finish()
        assert resumed.items == whole, cut


def test_a_call_cut_by_the_token_limit_is_incomplete() -> None:
    asm = CallAssembler(counter(), callable_names=NAMES)
    asm.feed(TextDelta(render_call("add", '{"a": 1}')[:-20]))
    asm.finish("incomplete")
    assert asm.items[-1]["type"] == "function_call"
    assert asm.items[-1]["status"] == "incomplete"


@pytest.mark.parametrize("names", [(), ("add",)])
def test_a_call_of_a_tool_not_offered_stays_text(names: tuple[str, ...]) -> None:
    """Only the names the turn's grammar offers make calls: with none offered (a turn
    under tool_choice "none", or past max_tool_calls) every call the model writes, and
    with ``add`` only, the call of ``get_weather``, stays text, whole."""
    items, _ = run([TEXT], names)
    calls = [item for item in items if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == list(names)
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    assert TEXT.split("\n")[0] in text  # the call of get_weather, as written


def test_text_that_only_looks_like_a_call_stays_text() -> None:
    items, _ = run(["a <tool_call>oops</tool_call> b"])
    assert [item["type"] for item in items] == ["message"]
    assert items[0]["content"][0]["text"] == "a <tool_call>oops</tool_call> b"


def test_a_call_head_cut_by_the_token_limit_is_not_text() -> None:
    asm = CallAssembler(counter(), callable_names=NAMES)
    asm.feed(TextDelta(render_call("add", '{"a": 1}') + '\n<tool_call>{"na'))
    asm.finish("incomplete")
    assert [item["type"] for item in asm.items] == ["function_call"]
