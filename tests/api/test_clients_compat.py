"""What real agent clients send (issue 24), in process with the test engine: Codex CLI's
Responses body, namespaces, hosted tools under ``auto``, relaxed schema keywords,
one ``404`` for an unknown model on every route, model aliases, the refusal ring,
``HEAD /`` and the task's ``node``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.app import toolcheck, tooldefs
from lmsp.app.service import Service
from lmsp.engines.base import EngineError
from lmsp.errors import LmspError
from lmsp.protocol import items
from lmsp.protocol.assembler import CallStart
from lmsp.protocol.itemtypes import plain
from lmsp.protocol.request import CreateRequest
from lmsp.protocol.toolcalls import CallAssembler
from lmsp.protocol.tools import FunctionTool, typed_tools
from lmsp.runner import relax

MODEL = "lmsp-test"
FUNCTION = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}

#: the body Codex CLI 0.171 sends for its default model, cut down (its tools come in an
#: ``additional_tools`` input item: a namespace holding a free-form ``custom`` tool)
CODEX_BODY: dict[str, Any] = {
    "model": MODEL,
    "input": [
        {
            "type": "additional_tools",
            "id": "at_1",
            "role": "developer",
            "tools": [
                {
                    "type": "namespace",
                    "name": "functions",
                    "description": "",
                    "tools": [{"type": "custom", "name": "exec", "description": "Run JS"}],
                }
            ],
        },
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
    ],
    "stream": False,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low", "summary": "auto", "context": "all_turns"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a23efa-75a6-7ea3-bc1b-c56298d62538",
    "text": {"verbosity": "low"},
    "client_metadata": {"x-codex-turn-metadata": "{}"},
}


def test_codex_default_body_is_accepted(client: TestClient) -> None:
    answer = client.post(
        "/v1/responses",
        json=CODEX_BODY,
        headers={"x-codex-beta-features": "remote_compaction_v2", "x-codex-window-id": "w:0"},
    )
    assert answer.status_code == 200, answer.text
    obj = answer.json()
    assert obj["status"] == "completed"
    assert not [i for i in obj["output"] if i["type"] == "reasoning"]  # none made
    assert obj["reasoning"] == {"effort": "low", "summary": "auto"}
    # the custom tool cannot be offered: the response's tools say so
    assert obj["tools"] == [{"type": "custom", "namespace": "functions", "offered": False}]


def test_a_turn_of_no_message_is_answered(client: TestClient) -> None:
    """An input of tool lists alone (no message) still opens the model's answer; the test
    engine once saw an empty prompt here and failed the task (make test's a_request
    campaign)."""
    for item in (
        {"type": "additional_tools", "tools": []},
        {"type": "mcp_list_tools", "server_label": "s", "tools": []},
    ):
        body = {"model": MODEL, "input": [item], "max_output_tokens": 3}
        answer = client.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "incomplete", answer.json()["error"]
        assert answer.json()["output"][0]["content"][0]["text"]


def test_hosted_tools_are_not_offered_under_auto_and_refused_when_forced(
    client: TestClient,
) -> None:
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "code_interpreter"}]
    body = {"model": MODEL, "input": "hi", "tools": hosted, "tool_choice": "auto"}
    answer = client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["tools"] == [
        {"type": "web_search", "offered": False},
        {"type": "code_interpreter", "offered": False},
    ]
    forced = client.post("/v1/responses", json={**body, "tool_choice": {"type": "web_search"}})
    assert forced.status_code == 400
    assert forced.json()["error"]["param"] == "tool_choice.type"


def test_namespaces_are_flattened_with_their_places() -> None:
    given = [
        FUNCTION,
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "agents",
            "tools": [
                {"type": "function", "name": "close_agent", "strict": False},
                {"type": "function", "name": "wait_agent"},
            ],
        },
        {"type": "web_search"},
    ]
    tools = tooldefs.read_tools(given, tooldefs.RESPONSES)
    assert [(t.get("name"), t.get("namespace")) for t in tools] == [
        ("spawn_agent", None),
        ("close_agent", "multi_agent_v1"),
        ("wait_agent", "multi_agent_v1"),
        (None, None),
    ]
    assert tooldefs.places(tools) == [
        ("tools", 0),
        ("tools", 1, "tools", 0),
        ("tools", 1, "tools", 1),
        ("tools", 2),
    ]
    # a namespace's tool of the same name as a plain one is refused at its own place
    clash = [FUNCTION, {"type": "namespace", "name": "ns", "tools": [FUNCTION]}]
    problems = list(
        toolcheck.problems(tooldefs.read_tools(clash, tooldefs.RESPONSES), None, None, None)
    )
    assert [(p.code, p.param) for p in problems] == [("invalid_value", "tools.1.tools.0.name")]
    # Chat Completions has no namespaces
    chat = tooldefs.read_tools([{"type": "namespace", "name": "n", "tools": []}], tooldefs.CHAT)
    assert next(toolcheck.problems(chat, None, None, None)).param == "tools.0.type"


def test_a_namespaced_call_names_its_namespace_and_comes_back() -> None:
    assembler = CallAssembler()
    assembler.namespaces = {"spawn_agent": "multi_agent_v1"}
    events = assembler.feed(CallStart(name="spawn_agent", call_id="call_1"))
    assert events[0]["item"]["namespace"] == "multi_agent_v1"
    given = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "spawn_agent",
        "namespace": "multi_agent_v1",
        "arguments": "{}",
    }
    (item,) = items.normalize([given])
    assert item["namespace"] == "multi_agent_v1"


# -- keywords a grammar cannot enforce ------------------------------------------------------
CLAUDE_METADATA = {
    "type": "object",
    "properties": {
        "subject": {"type": "string"},
        "metadata": {
            "type": "object",
            "propertyNames": {"type": "string", "pattern": "^[a-z]+$"},
            "additionalProperties": {},
        },
    },
    "required": ["subject"],
    "additionalProperties": False,
}


def _request(strict: bool | None) -> CreateRequest:
    tool: dict[str, Any] = {"type": "function", "name": "TaskCreate", "parameters": CLAUDE_METADATA}
    if strict is not None:
        tool["strict"] = strict
    return CreateRequest(model=MODEL, given="hi", tools=typed_tools([tool]))


def test_a_lenient_tool_has_unenforceable_keywords_relaxed(svc: Service) -> None:
    request = asyncio.run(toolcheck.check_grammar(svc.grammars, _request(strict=False)))
    (tool,) = request.tools or ()
    assert isinstance(tool, FunctionTool)
    stored = plain(tool)  # what the store keeps
    assert stored["relaxed"] == ["properties.metadata.propertyNames"]
    assert "propertyNames" not in stored["enforced_parameters"]["properties"]["metadata"]
    assert tool.parameters == CLAUDE_METADATA  # as given: the call is checked against it
    good = {"type": "function_call", "name": "TaskCreate", "arguments": '{"subject": "x"}'}
    relax.check_calls([good], [tool])
    bad = {**good, "arguments": '{"subject": "x", "metadata": {"Bad Key": 1}}'}
    with pytest.raises(EngineError) as caught:
        relax.check_calls([bad], [tool])
    assert caught.value.code == "tool_arguments_invalid"
    assert "TaskCreate" in caught.value.message


@pytest.mark.parametrize("strict", [True, None])  # /v1/responses: strict unless told
def test_a_strict_tool_keeps_the_refusal(svc: Service, strict: bool | None) -> None:
    with pytest.raises(LmspError) as caught:
        asyncio.run(toolcheck.check_grammar(svc.grammars, _request(strict)))
    assert caught.value.code == "unsupported_schema"
    assert caught.value.param == "tools.0.parameters.properties.metadata.propertyNames"


# -- one answer for an unknown model, and aliases --------------------------------------------
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
]


def test_an_unknown_model_is_the_same_404_everywhere_and_an_alias_answers(
    client: TestClient,
) -> None:
    for path, body in ROUTES:
        answer = client.post(path, json={**body, "model": "gpt-4o-mini"})
        assert answer.status_code == 404, (path, answer.text)
        error = answer.json()["error"]
        assert "gpt-4o-mini" in error["message"] and MODEL in error["message"], path
        assert "The models here:" in error["message"], path
        if path != "/v1/messages":  # Anthropic's envelope has no code or param
            assert (error["code"], error["param"]) == ("model_not_found", "model"), path
    made = client.put("/v1/model_aliases/gpt-4o-mini", json={"model": MODEL})
    assert made.status_code == 200 and made.json()["model"] == MODEL
    for path, body in ROUTES[:3]:
        answer = client.post(path, json={**body, "model": "gpt-4o-mini"})
        assert answer.status_code == 200, (path, answer.text)
    listed = client.get("/v1/model_aliases").json()["data"]
    assert [(a["alias"], a["model"]) for a in listed] == [("gpt-4o-mini", MODEL)]
    assert client.put("/v1/model_aliases/x", json={"model": "nope"}).status_code == 404
    assert client.put(f"/v1/model_aliases/{MODEL}", json={"model": MODEL}).status_code == 409
    assert client.delete("/v1/model_aliases/gpt-4o-mini").status_code == 200
    assert (
        client.post("/v1/responses", json={"model": "gpt-4o-mini", "input": "x"}).status_code == 404
    )


def test_refusals_are_kept_with_their_client(client: TestClient) -> None:
    client.post("/v1/responses", json={"model": "nope", "input": "hi"})
    client.post("/v1/responses", json={"model": MODEL, "input": "hi", "top_p": 5})
    recent = client.get("/v1/refusals", params={"limit": 2}).json()["data"]
    assert [(r["status"], r["code"], r["param"]) for r in recent] == [
        (400, "invalid_value", "top_p"),
        (404, "model_not_found", "model"),
    ]
    assert all(r["client_id"] and r["path"] == "/v1/responses" for r in recent)


def test_head_root_and_the_task_names_no_node_on_one_machine(client: TestClient) -> None:
    assert client.head("/").status_code == 200
    obj = client.post("/v1/responses", json={"model": MODEL, "input": "hi"}).json()
    task = client.get(f"/v1/tasks/{obj['task']['id']}").json()
    assert "node" in task and task["node"] is None
