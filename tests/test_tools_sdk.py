"""A whole tool loop through the official ``openai`` SDK, both APIs, against a real
``lmsp serve`` and the real model: the model calls a function (its streamed argument
deltas add up to the ``.done`` arguments, which validate), the agent sends the result
back, the model answers in text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import openai
import pytest
from jsonschema import validate
from pydantic import BaseModel, Field

from tests.helpers import Server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
RESPONSES_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": PARAMETERS,
    "strict": True,
}
CHAT_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": PARAMETERS,
        "strict": True,
    },
}
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    server = Server(tmp_path_factory.mktemp("tools-sdk") / "data").start()
    try:
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key=server.token, max_retries=0, timeout=600
        ) as client:
            yield client
    finally:
        server.stop()


def test_responses_tool_loop(sdk: openai.OpenAI) -> None:
    stream = sdk.responses.create(
        model=MODEL,
        input=QUESTION,
        tools=[RESPONSES_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        extra_body={"seed": 3},
        stream=True,
    )
    kinds: list[str] = []
    deltas: dict[str, str] = {}
    done: dict[str, str] = {}
    final = None
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.function_call_arguments.delta":
            deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
        elif event.type == "response.function_call_arguments.done":
            done[event.item_id] = event.arguments
        elif event.type == "response.completed":
            final = event.response
    assert final is not None and final.status == "completed"
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and deltas == done
    for call in calls:
        assert call.name == "get_weather" and done[call.id] == call.arguments
        validate(json.loads(call.arguments), PARAMETERS)
    # the Open Responses order for one call item
    first = kinds.index("response.output_item.added")
    assert kinds.index("response.function_call_arguments.delta") > first
    assert (
        kinds.index("response.function_call_arguments.done")
        < kinds.index("response.output_item.done")
        < kinds.index("response.completed")
    )

    call = calls[0]
    answer = sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"},
        ],
        tools=[RESPONSES_TOOL],
        tool_choice="none",
        max_output_tokens=40,
        extra_body={"seed": 3},
    )
    assert answer.status in ("completed", "incomplete")
    assert answer.output_text and not [i for i in answer.output if i.type == "function_call"]


def test_chat_tool_loop(sdk: openai.OpenAI) -> None:
    first = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[CHAT_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=60,
        seed=5,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and all(c.type == "function" for c in calls)
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    validate(json.loads(call.function.arguments), PARAMETERS)

    streamed = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[CHAT_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        seed=5,
        stream=True,
    )
    arguments = ""
    reasons = []
    for chunk in streamed:
        for part in chunk.choices:
            for delta in part.delta.tool_calls or []:
                if delta.index == 0 and delta.function and delta.function.arguments:
                    arguments += delta.function.arguments
            if part.finish_reason:
                reasons.append(part.finish_reason)
    assert reasons == ["tool_calls"]
    validate(json.loads(arguments), PARAMETERS)

    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
        ],
        tools=[CHAT_TOOL],
        tool_choice="none",
        max_tokens=40,
        seed=5,
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


class Person(BaseModel):
    name: Annotated[str, Field(max_length=20)]
    age: Annotated[int, Field(ge=0, le=120)]


def test_chat_parse_with_a_pydantic_model(sdk: openai.OpenAI) -> None:
    for seed in (1, 2):
        parsed = sdk.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
            response_format=Person,
            max_tokens=80,
            seed=seed,
        )
        assert parsed.choices[0].finish_reason == "stop"
        assert isinstance(parsed.choices[0].message.parsed, Person)
