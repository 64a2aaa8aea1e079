"""JSON Schemas as GBNF (no model): what GBNF cannot hold exactly is refused naming the
keyword's place; a written grammar is never looser than its schema — random walks
through it (llguidance reading the GBNF over a byte vocabulary) give only JSON that
validates — and lays JSON out as the local engine does."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from lmsp.constraints import gbnf, grammar
from lmsp.constraints.budget import _tokenizer, accepts_job
from tests.gbnf_schemas import SCHEMAS

EOS = 256

REFUSED: list[tuple[Any, str | None]] = [
    ({"type": "string", "pattern": "^a+$"}, "pattern"),
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "number", "multipleOf": 2}, "multipleOf"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
    ({"allOf": [{"type": "string"}]}, "allOf"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {}}, "if"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, "prefixItems"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    ({"anyOf": [{"type": "string"}], "type": "string"}, "anyOf"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}}, ""),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
    ({"type": "array", "maxItems": gbnf.MAX_REPEAT + 1}, "maxItems"),
    ({"type": "string", "minLength": 4, "maxLength": 3}, "minLength"),
    ({"type": "string", "maxLength": -1}, "maxLength"),
    ({"type": "colour"}, "type"),
    ({"properties": {"a": {}}, "items": {}}, ""),
    ({"type": "object", "properties": {"a": False}}, "properties.a"),
    ({"enum": ["a", 1], "type": "boolean"}, ""),
    (
        {"type": "object", "properties": {"a": {"type": "integer", "maximum": 9}}},
        "properties.a.maximum",
    ),
    ({"anyOf": [{"type": "null"}, {"type": "string", "pattern": "a"}]}, "anyOf.1.pattern"),
]


@pytest.mark.parametrize(("schema", "path"), REFUSED)
def test_what_gbnf_cannot_hold_exactly_is_refused_naming_its_place(
    schema: Any, path: str | None
) -> None:
    with pytest.raises(grammar.UnsupportedSchema) as caught:
        gbnf.from_schema(schema)
    assert caught.value.message
    assert (caught.value.path or "") == path


def test_only_lmsps_own_layout_and_only_a_schema_are_written() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert gbnf.from_llguidance(grammar.json_grammar(schema)) == gbnf.from_schema(schema)
    other = {**schema, "x-guidance": {"whitespace_flexible": True}}
    with pytest.raises(grammar.UnsupportedSchema):
        gbnf.from_schema(other)
    calls = grammar.calls_grammar([grammar.Function("f", schema)], required=True, limit=1)
    with pytest.raises(grammar.UnsupportedSchema):
        gbnf.from_llguidance(calls)


def _matcher(schema: Any) -> LLMatcher:
    lark = LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf.from_schema(schema)))
    matcher = LLMatcher(_tokenizer(), lark, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(schema: Any, text: str) -> bool:
    return accepts_job(LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf.from_schema(schema))), text)


def test_json_is_laid_out_as_the_local_engine_writes_it() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "array"}},
        "required": ["a", "b"],
    }
    assert _accepts(schema, '{"a": 1, "b": [true, null, {"k": "v"}]}')
    assert not _accepts(schema, '{"a":1,"b":[]}')  # compact without spaces: not this layout
    assert not _accepts(schema, '{"b": [], "a": 1}')  # the schema's order
    assert not _accepts(schema, '{"a": 1, "b": [], "c": 2}')  # no name it does not give
    assert not _accepts(schema, '{"a": 01, "b": []}')
    assert _accepts({"type": "string"}, '"a\\"b\\u00e9\\n"')
    assert not _accepts({"type": "string"}, '"a\nb"')  # a raw control character


def test_optional_members_may_be_left_out_each_and_every_way() -> None:
    names = ["a", "b", "c", "d"]
    schema = {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in names},
        "required": ["c"],
    }
    for size in range(len(names) + 1):
        for chosen in itertools.combinations(names, size):
            text = "{" + ", ".join(f'"{n}": 1' for n in chosen) + "}"
            assert _accepts(schema, text) == ("c" in chosen), text


def _walk(matcher: LLMatcher, rng: random.Random, limit: int = 600) -> str | None:
    """A random path through the grammar (bytes), ended where it may end; ``None`` when
    it ran past ``limit`` bytes."""
    out = bytearray()
    while len(out) < limit:
        mask = np.unpackbits(
            np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )
        allowed = np.flatnonzero(mask[: EOS + 1])
        assert allowed.size, out  # never stuck: every path leads to an end
        if EOS in allowed and (allowed.size == 1 or rng.random() < 0.3):
            return out.decode()
        byte = int(rng.choice([int(t) for t in allowed if t != EOS]))
        assert matcher.consume_token(byte)
        out.append(byte)
    return None


def test_every_walk_through_a_written_grammar_is_json_its_schema_admits() -> None:
    ended: list[str] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(schema=SCHEMAS, seed=st.integers(0, 2**32 - 1))
    def walk(schema: dict[str, Any], seed: int) -> None:
        text = _walk(_matcher(schema), random.Random(seed))
        if text is not None:
            jsonschema.validate(json.loads(text), schema)
            ended.append(text)

    walk()
    assert len(ended) >= 150, len(ended)  # of 300 (others ran past the walk's limit)
