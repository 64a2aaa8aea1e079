"""Tool call ids in a request's history, through a real ``lmsp serve`` and the official
``anthropic`` and ``openai`` SDKs, unchanged.

A call id names one call: an answer (``tool_result``, ``function_call_output``, a
``tool`` message) says which call it answers by it. Two calls with one id — two
``tool_use`` blocks of an Anthropic request, two ``function_call`` items of a Responses
input, two ``tool_calls`` of a chat history — are refused with a ``400`` naming the
second (they were accepted, ``200``), and so is a ``tool_result`` answering no
``tool_use``; nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.helpers import Server, served

MODEL = "lmsp-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served(tmp_path_factory.mktemp("call-ids") / "data") as srv:
        yield srv


def tasks(server: Server) -> int:
    with server.client() as http:
        return len(http.get("/v1/tasks", params={"limit": 100}).json()["data"])


def use(call_id: str, city: str = "Paris") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "weather", "input": {"city": city}}


def result(call_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "sunny"}


QUESTION = {"role": "user", "content": "Weather?"}
ANTHROPIC_CASES = [
    (  # two tool_use blocks with one id in one message (the red team's)
        [QUESTION, {"role": "assistant", "content": [use("tu_1"), use("tu_1", "Oslo")]}],
        "messages.1.content.1.id",
    ),
    (  # the same id in two assistant messages
        [
            QUESTION,
            {"role": "assistant", "content": [use("tu_1")]},
            {"role": "user", "content": [result("tu_1")]},
            {"role": "assistant", "content": [use("tu_1", "Oslo")]},
        ],
        "messages.3.content.0.id",
    ),
    (  # a tool_result answering no tool_use (refused before too)
        [
            QUESTION,
            {"role": "assistant", "content": [use("tu_1")]},
            {"role": "user", "content": [result("tu_2")]},
        ],
        "messages.2.content.0.tool_use_id",
    ),
]


@pytest.mark.parametrize(("history", "where"), ANTHROPIC_CASES)
def test_anthropic_refuses_a_repeated_tool_use_id(
    server: Server, history: list[dict[str, Any]], where: str
) -> None:
    answered = {"role": "user", "content": [result("tu_1")]}
    messages = history if history[-1]["role"] == "user" else [*history, answered]
    before = tasks(server)
    sdk = anthropic.Anthropic(base_url=server.url, api_key=server.token, max_retries=0)
    with sdk, pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(model=MODEL, max_tokens=8, messages=messages)  # type: ignore[arg-type]
    assert refused.value.status_code == 400
    body: Any = refused.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{where}: "), body
    assert tasks(server) == before  # nothing was written


def call(call_id: str, city: str = "Paris") -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "weather",
        "arguments": f'{{"city": "{city}"}}',
    }


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


def openai_sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token, max_retries=0)


def test_responses_refuse_two_function_calls_with_one_call_id(server: Server) -> None:
    given: Any = [{"role": "user", "content": "Weather?"}, call("c1"), call("c1", "Oslo")]
    given.append(output("c1"))
    before = tasks(server)
    with openai_sdk(server) as sdk, pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input=given, max_output_tokens=8)
    error: Any = refused.value.body
    assert error["code"] == "invalid_value" and error["param"] == "input.2.call_id", error
    assert "'c1'" in error["message"] and "input.1" in error["message"]
    assert tasks(server) == before
    # one call, its output: served as before
    with openai_sdk(server) as sdk:
        fine = sdk.responses.create(model=MODEL, input=[given[0], *given[2:]], max_output_tokens=8)
    assert fine.status in ("completed", "incomplete")  # 8 tokens may cut it


def test_chat_refuses_two_tool_calls_with_one_id(server: Server) -> None:
    def tool_call(call_id: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
        }

    messages: Any = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "tool_calls": [tool_call("c2"), tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    before = tasks(server)
    with openai_sdk(server) as sdk, pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    error: Any = refused.value.body
    assert error["param"] == "messages.3.tool_calls.1.id", error
    assert "messages.1.tool_calls.0.id" in error["message"]
    assert tasks(server) == before


def test_a_conversation_refuses_items_with_one_call_id(server: Server) -> None:
    with server.client() as http:
        made = http.post("/v1/conversations", json={"items": [call("c1"), call("c1")]})
    assert made.status_code == 400, made.text
    assert made.json()["error"]["param"] == "items.1.call_id"


def test_the_raw_wire_names_the_field(server: Server) -> None:
    """Without an SDK: the section-8 shape for the Responses route."""
    body = {"model": MODEL, "input": [call("x"), call("x"), output("x")]}
    answer = httpx.post(
        f"{server.url}/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=60,
    )
    assert answer.status_code == 400
    assert set(answer.json()["error"]) == {"type", "code", "message", "param"}
    assert answer.json()["error"]["param"] == "input.1.call_id"
