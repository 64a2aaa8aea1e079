"""A create body is parsed once (issue 37): its ``tools`` are read and its ``input``
items checked once per create, on every API that makes one, through the whole life of
the create (its checks, its preparation, its run)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.app import tooldefs
from lmsp.protocol import items

TOOL = {
    "type": "function",
    "name": "weather",
    "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times a tools list is read (:func:`lmsp.app.tooldefs.read_tools`), an
    input item checked (every item passes ``items._item``, from either entry point) and
    a whole ``input`` (:func:`lmsp.protocol.items.normalize`)."""
    calls: Counter[str] = Counter()

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(tooldefs, "read_tools", counting("tools", tooldefs.read_tools))
    monkeypatch.setattr(items, "_item", counting("items", items._item))
    monkeypatch.setattr(items, "normalize", counting("input", items.normalize))
    return calls


def test_a_response_create_reads_its_tools_and_input_once(
    client: TestClient, counted: Counter[str]
) -> None:
    body = {
        "model": "lmsp-test",
        "input": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [TOOL],
        "tool_choice": "none",  # the test engine cannot hold a call to a grammar
        "max_output_tokens": 4,
        "seed": 1,
    }
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "incomplete" and r.json()["tools"][0]["name"] == "weather"
    assert counted == {"tools": 1, "items": 2, "input": 1}


def test_a_chat_completion_reads_its_tools_and_messages_once(
    client: TestClient, counted: Counter[str]
) -> None:
    body = {
        "model": "lmsp-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}],
        "tool_choice": "none",
        "max_tokens": 4,
        "seed": 1,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert counted["tools"] == 1 and counted["items"] == 2


def test_a_message_reads_its_messages_once(client: TestClient, counted: Counter[str]) -> None:
    body = {
        "model": "lmsp-test",
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Where?"},
            {"role": "user", "content": "Paris."},
        ],
        "max_tokens": 4,
    }
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert counted["items"] == 3


def test_a_completion_reads_its_prompt_once(client: TestClient, counted: Counter[str]) -> None:
    r = client.post(
        "/v1/completions", json={"model": "lmsp-test", "prompt": "Once upon", "max_tokens": 3}
    )
    assert r.status_code == 200, r.text
    assert counted["input"] == 1  # the prompt: one raw item
