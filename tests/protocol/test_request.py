"""The typed create request (lmsp.protocol.request): frozen, stored and read back as the
same type, and every row an earlier version stored read as it was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmsp.protocol import objects
from lmsp.protocol import request as stored
from lmsp.protocol.itemtypes import FunctionCall, InputFile, McpApprovalResponse, Message
from lmsp.protocol.tools import AllowedTools, FunctionTool, HostedTool, McpTool

#: rows the code before issue 37 wrote (tests/protocol/old_requests.json says how)
OLD = json.loads((Path(__file__).parent / "old_requests.json").read_text())


@pytest.mark.parametrize("name", sorted(OLD["rows"]))
def test_a_row_the_earlier_code_stored_reads_back_whole(name: str) -> None:
    text = OLD["rows"][name]
    request = stored.loads(text)
    assert isinstance(request, stored.PreparedRequest)
    # stored again, it is the same JSON: no field lost, none added, none changed
    assert json.loads(stored.dumps(request)) == json.loads(text)
    assert stored.loads(stored.dumps(request)) == request  # and the same typed value


def test_an_earlier_row_is_read_into_its_types() -> None:
    request = stored.loads(OLD["rows"]["tools"])
    weather, f1, hosted, server = request.tools or ()
    assert isinstance(weather, FunctionTool) and not weather.is_strict
    assert weather.relaxed == ("properties.m.propertyNames",)
    assert weather.grammar_schema() == {"type": "object", "properties": {"m": {"type": "object"}}}
    assert isinstance(f1, FunctionTool) and f1.is_strict and f1.namespace == "ns"
    assert isinstance(hosted, HostedTool) and hosted.type == "web_search" and not hosted.offered
    assert isinstance(server, McpTool) and server.headers == {"X-Token": "[redacted]"}
    assert isinstance(request.tool_choice, AllowedTools)
    assert [choice.name for choice in request.tool_choice.tools] == ["weather"]
    developer, user, *mcp_items = request.input
    assert isinstance(developer, Message) and developer.role == "developer"
    assert isinstance(user, Message)
    (_, attached) = user.content
    assert isinstance(attached, InputFile) and attached.text == "kumquat-7"
    assert isinstance(mcp_items[-1], McpApprovalResponse) and not mcp_items[-1].approve
    # what it runs with is what was fixed when it was created
    assert stored.sampling_used(request)["top_k"] == 5
    assert request.seed == 3 and request.on_restart == "retry" and request.service_tier == "flex"
    turn = stored.loads(OLD["rows"]["conversation"])
    assert turn.turn == (turn.conversation.id if turn.conversation else None, 1)
    assert stored.loads(OLD["rows"]["completion"]).raw_prompt is True


def test_a_prepared_request_is_frozen() -> None:
    request = stored.loads(OLD["rows"]["chat"])
    with pytest.raises(AttributeError):
        request.model = "another"  # type: ignore[misc]
    tool = FunctionTool(name="f")
    with pytest.raises(AttributeError):
        tool.name = "g"  # type: ignore[misc]


def _row(**fields: Any) -> str:
    return json.dumps({"model": "m", **fields})


def test_rows_of_older_versions_still_read() -> None:
    """Shapes stored before input items were normalized, before history was kept by
    reference and before ``truncation`` recorded only the first and last items."""
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c",
        "name": "w",
        "arguments": "{}",
        "status": "completed",
    }
    old = stored.loads(
        _row(
            input="hello",
            stop="END",
            lmsp_history=[{"role": "user", "content": "a"}, call],
            lmsp_truncated={
                "items": 2,
                "dropped": [
                    {"id": "m1", "type": "message", "role": "user"},
                    {"id": "fc_1", "type": "function_call", "role": None},
                ],
            },
        )
    )
    (hello,) = old.input
    assert isinstance(hello, Message) and hello.role == "user"
    assert old.stop == ("END",)
    assert old.history is not None
    assert isinstance(old.history[0], Message) and isinstance(old.history[1], FunctionCall)
    assert objects.render_truncated(old.truncated) == {
        "items": 2,
        "first": {"id": "m1", "type": "message", "role": "user"},
        "last": {"id": "fc_1", "type": "function_call", "role": None},
    }
    # a history kept inline is not written back: it is kept by reference now
    assert "lmsp_history" not in json.loads(stored.dumps(old))
