"""Structured output and tool calls against the real bundled model (SmolLM2-135M) at
temperature 1.0: whatever the seed, the output parses and validates, because decoding
is constrained by the schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker

from tests.api.test_wire import counts

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow


def validate(schema: dict[str, Any], value: Any) -> None:
    Draft202012Validator(schema, format_checker=FormatChecker()).validate(value)


# -- generated schemas of the supported subset ----------------------------------------------
NAMES = st.sampled_from(["id", "name", "city", "count", "price", "tags", "when", "kind", "ok"])


@st.composite
def integers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-1000, 1000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 5000))}


@st.composite
def numbers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-100, 100))
    return {"type": "number", "minimum": low, "maximum": low + draw(st.integers(1, 1000))}


@st.composite
def strings(draw: st.DrawFn) -> dict[str, Any]:
    most = draw(st.integers(1, 16))
    return {"type": "string", "minLength": draw(st.integers(0, most)), "maxLength": most}


LEAVES = st.one_of(
    integers(),
    numbers(),
    strings(),
    st.just({"type": "boolean"}),
    st.sampled_from(
        [
            {"type": "string", "format": "date"},
            {"type": "string", "format": "uuid"},
            {"type": "string", "pattern": "^[a-z]{2,6}-[0-9]{1,3}$"},
        ]
    ),
    st.lists(
        st.one_of(st.sampled_from(["red", "green", "blue", "x y"]), st.integers(0, 9)),
        min_size=1,
        max_size=4,
        unique=True,
    ).map(lambda values: {"enum": values}),
)


def _compound(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.dictionaries(NAMES, inner, min_size=1, max_size=3).map(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        }
    )
    arrays = st.tuples(inner, st.integers(0, 3)).map(
        lambda pair: {"type": "array", "items": pair[0], "maxItems": pair[1]}
    )
    unions = st.lists(inner, min_size=2, max_size=2).map(lambda pair: {"anyOf": pair})
    return st.one_of(objects, arrays, unions)


SCHEMAS = st.recursive(LEAVES, _compound, max_leaves=5).map(
    lambda schema: {
        "type": "object",
        "properties": {"answer": schema},
        "required": ["answer"],
        "additionalProperties": False,
    }
)


def create(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/responses", json={"model": MODEL, "temperature": 1.0, **body})
    assert answer.status_code == 200, answer.text
    obj: dict[str, Any] = answer.json()
    return obj


def output_text(obj: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in obj["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def test_every_structured_output_validates(
    client: TestClient, schema: dict[str, Any], seed: int
) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    obj = create(
        client,
        {
            "input": "Answer with JSON.",
            "seed": seed,
            "max_output_tokens": 400,
            "text": {"format": fmt},
        },
    )
    assert obj["status"] == "completed", (schema, obj["output"])
    validate(schema, json.loads(output_text(obj)))
    assert obj["text"]["format"] == fmt  # the response echoes the format


def test_json_object_is_an_object(client: TestClient) -> None:
    for seed in range(2):
        obj = create(
            client,
            {
                "input": "Give me a JSON object about a cat.",
                "seed": seed,
                "max_output_tokens": 60,
                "text": {"format": {"type": "json_object"}},
            },
        )
        if obj["status"] == "completed":
            assert isinstance(json.loads(output_text(obj)), dict)
        else:  # the budget ran out: what there is, is the start of an object
            assert output_text(obj).startswith("{")


# -- tools ------------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
TOOLS = {tool["name"]: tool for tool in (WEATHER, ADD)}
SEEDS = range(4)  # each a real-model run: the property tests carry the many seeds


def calls_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in obj["output"] if item["type"] == "function_call"]


def check_calls(obj: dict[str, Any], names: set[str]) -> list[dict[str, Any]]:
    calls = calls_of(obj)
    for call in calls:
        assert call["name"] in names
        assert call["status"] == "completed"
        assert call["call_id"] and call["id"]
        validate(TOOLS[call["name"]]["parameters"], json.loads(call["arguments"]))
    return calls


def ask(client: TestClient, seed: int, **extra: Any) -> dict[str, Any]:
    body = {
        "input": "What is the weather in Paris, and what is 2 + 3?",
        "tools": [WEATHER, ADD],
        "seed": seed,
        "max_output_tokens": 120,
        **extra,
    }
    return create(client, body)


def test_required_always_calls_with_valid_arguments(client: TestClient) -> None:
    for seed in SEEDS:
        obj = ask(client, seed, tool_choice="required")
        assert obj["status"] == "completed"
        assert check_calls(obj, set(TOOLS)), obj["output"]
        assert all(item["type"] == "function_call" for item in obj["output"])


def test_a_named_function_is_the_one_called(client: TestClient) -> None:
    for seed in SEEDS:
        obj = ask(client, seed, tool_choice={"type": "function", "name": "add"})
        calls = check_calls(obj, {"add"})
        assert calls and obj["tool_choice"] == {"type": "function", "name": "add"}


def test_allowed_tools_are_a_hard_limit(client: TestClient) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}],
    }
    for seed in SEEDS:
        obj = ask(client, seed, tool_choice=choice)
        assert check_calls(obj, {"get_weather"})
    auto = {**choice, "mode": "auto"}
    for seed in SEEDS[:2]:
        check_calls(ask(client, seed, tool_choice=auto), {"get_weather"})


def test_none_never_calls(client: TestClient) -> None:
    for seed in SEEDS:
        obj = ask(client, seed, tool_choice="none", max_output_tokens=30)
        assert not calls_of(obj)
        assert all(item["type"] == "message" for item in obj["output"])


def test_auto_calls_are_valid_and_limits_hold(client: TestClient) -> None:
    made = 0
    for seed in SEEDS[:2]:
        obj = ask(client, seed)  # auto: text, calls, or both
        made += len(check_calls(obj, set(TOOLS)))
        one = ask(client, seed, tool_choice="required", parallel_tool_calls=False)
        assert len(check_calls(one, set(TOOLS))) == 1
        two = ask(client, seed, tool_choice="required", max_tool_calls=2)
        assert 1 <= len(check_calls(two, set(TOOLS))) <= 2
    assert made >= 0


def test_unsupported_tools_and_keywords_write_nothing(client: TestClient) -> None:
    before = counts(client)
    cases = [
        ({"tools": [WEATHER, {"type": "teleport"}]}, "unsupported_parameter", "tools.1.type"),
        (
            {
                "tools": [
                    {
                        **ADD,
                        "parameters": {
                            "type": "object",
                            "properties": {"xs": {"type": "array", "uniqueItems": True}},
                        },
                    }
                ]
            },
            "unsupported_schema",
            "tools.0.parameters.properties.xs.uniqueItems",
        ),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "object", "dependentRequired": {"a": ["b"]}},
                    }
                }
            },
            "unsupported_schema",
            "text.format.schema.dependentRequired",
        ),
    ]
    for extra, code, param in cases:
        answer = client.post("/v1/responses", json={"model": MODEL, "input": "hi", **extra})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == code
        assert answer.json()["error"]["param"] == param
    assert counts(client) == before
