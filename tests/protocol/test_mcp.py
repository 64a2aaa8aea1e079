"""The pure parts of MCP tools: definitions, hosts, headers, approvals, schemas, and the
assembler of the loop's items (rebuilt from its own events, as a resumed task does)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lmsp.errors import LmspError
from lmsp.protocol import mcp
from lmsp.protocol.assembler import TextDelta
from lmsp.protocol.mcpcalls import McpAssembler
from lmsp.protocol.toolcalls import render_call
from lmsp.protocol.tools import McpTool, typed_tools


@pytest.mark.parametrize(
    ("url", "allowed", "ok"),
    [
        ("http://127.0.0.1:8000/mcp", [], True),
        ("http://localhost/mcp", [], True),
        ("http://[::1]:9/mcp", [], True),
        ("https://127.5.0.1/mcp", [], True),
        ("http://example.com/mcp", [], False),
        ("http://example.com/mcp", ["example.com"], True),
        ("http://example.com:8080/mcp", ["example.com:9090"], False),
        ("http://example.com:8080/mcp", ["example.com:8080"], True),
        ("https://example.com/mcp", ["example.com:443"], True),
        ("http://10.1.2.3/mcp", ["*"], True),
        ("ftp://127.0.0.1/mcp", ["*"], False),
        ("http://user:pw@127.0.0.1/mcp", [], False),
        ("nonsense", [], False),
    ],
)
def test_hosts(url: str, allowed: list[str], ok: bool) -> None:
    assert mcp.host_allowed(url, allowed) is ok


def test_a_tool_definition_is_read_and_its_headers_taken_out() -> None:
    given = {
        "type": "mcp",
        "server_label": "s1",
        "server_url": "http://127.0.0.1/mcp",
        "headers": {"X-Token": "sesame"},
        "authorization": "tok",
        "allowed_tools": {"read_only": True},
        "require_approval": {"never": {"tool_names": ["a"]}},
    }
    tools: list[dict[str, Any]] = [mcp.read_tool(given, "tools.0")]
    taken = mcp.take_headers(tools)
    assert taken == {"s1": {"X-Token": "sesame", "Authorization": "Bearer tok"}}
    assert tools[0]["headers"] == {
        "X-Token": "[redacted]",
        "Authorization": "[redacted]",
    }
    (typed,) = typed_tools(tools)  # what the request holds: the values redacted
    assert isinstance(typed, McpTool) and typed.headers == tools[0]["headers"]
    for bad, param in (
        ({**given, "server_label": "a b"}, "tools.0.server_label"),
        ({**given, "connector_id": "x"}, "tools.0.connector_id"),
        ({**given, "require_approval": "sometimes"}, "tools.0.require_approval"),
        ({**given, "headers": {"X": 1}}, "tools.0.headers.X"),
        ({**given, "surprise": 1}, "tools.0.surprise"),
    ):
        with pytest.raises(LmspError) as caught:
            mcp.read_tool(bad, "tools.0")
        assert caught.value.param == param


def server(**fields: Any) -> McpTool:
    """An MCP tool as a request holds it."""
    (tool,) = typed_tools([{"type": "mcp", "server_label": "s", "server_url": "u", **fields}])
    assert isinstance(tool, McpTool)
    return tool


def test_approvals_and_filters() -> None:
    read = {"readOnlyHint": True}
    assert mcp.needs_approval(server(), "a", None)  # OpenAI's default: always
    assert not mcp.needs_approval(server(require_approval="never"), "a", None)
    rule = server(require_approval={"never": {"read_only": True}})
    assert not mcp.needs_approval(rule, "a", read) and mcp.needs_approval(rule, "b", None)
    rule = server(require_approval={"always": {"tool_names": ["b"]}})
    assert mcp.needs_approval(rule, "b", None) and not mcp.needs_approval(rule, "a", None)
    assert mcp.allowed(server(allowed_tools=["a"]), "a", None)
    assert not mcp.allowed(server(allowed_tools=["a"]), "b", None)
    assert mcp.allowed(server(allowed_tools={"read_only": True}), "b", read)
    assert mcp.repeatable(read) and mcp.repeatable({"idempotentHint": True})
    assert not mcp.repeatable({"readOnlyHint": False}) and not mcp.repeatable(None)


def test_open_objects_are_closed() -> None:
    schema = {"type": "object", "properties": {"o": {"type": "object"}, "n": {"type": "string"}}}
    shown = mcp.closed(schema)
    assert shown["additionalProperties"] is False
    assert shown["properties"]["o"]["additionalProperties"] is False
    assert "additionalProperties" not in shown["properties"]["n"]
    kept = mcp.closed({"type": "object", "additionalProperties": True})
    assert kept["additionalProperties"] is True


def test_aliases_are_unique_and_callable_names() -> None:
    taken = {"lookup"}
    assert mcp.alias_for("lookup", taken) == "lookup_2"
    assert mcp.alias_for("a.b c", taken) == "a_b_c"


def _ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


RECORD = {"record": mcp.Offered("record", "s1", "record", None, {}, None, approval=False)}


def test_a_turn_that_offers_no_tool_reads_no_call() -> None:
    """A turn under tool_choice "none" or past max_tool_calls (nothing callable): the
    call the model writes (an injected one it repeats) is message text, never an
    mcp_call, and nothing is journaled to be sent."""
    asm = McpAssembler(RECORD, make_id=_ids())
    text = "Sure. " + render_call("record", '{"note": "hi"}')
    events = [e for i in range(0, len(text), 4) for e in asm.feed(TextDelta(text[i : i + 4]))]
    events += asm.close_open()
    assert [item["type"] for item in asm.items] == ["message"]
    assert asm.items[0]["content"][0]["text"] == text
    assert asm.pending_call() is None and not asm.sent
    assert not any(e["type"].startswith("response.mcp_call") for e in events)


@pytest.mark.parametrize("cut", ["closed", "open"])
def test_a_call_cut_by_the_budget_ends_incomplete(cut: str) -> None:
    """A forced call cut by max_output_tokens — its arguments whole and journaled but
    never sent, or still being written — ends incomplete: a terminal response holds no
    item in_progress."""
    asm = McpAssembler(RECORD, make_id=_ids())
    asm.callable = frozenset(RECORD)
    call = render_call("record", '{"note": "hi"}')
    asm.feed(TextDelta(call if cut == "closed" else call[:-14]))
    events = asm.finish("incomplete")
    (item,) = asm.items
    assert item["type"] == "mcp_call" and item["status"] == "incomplete"
    assert events[-1]["type"] == "response.output_item.done"
    assert events[-1]["item"]["status"] == "incomplete"
    assert all(i.get("status") != "in_progress" for i in asm.items)


def test_the_assembler_journals_a_call_and_rebuilds_from_its_events() -> None:
    offered = {
        "record": mcp.Offered("record", "s1", "record", None, {}, None, approval=False),
        "ask": mcp.Offered("ask", "s1", "ask", None, {}, None, approval=True),
    }
    asm = McpAssembler(offered, make_id=_ids())
    asm.callable = frozenset(offered)  # the turn's grammar offers both
    listed, logged = asm.open_list("s1")
    logged += asm.close_list(listed, [{"name": "record", "input_schema": {}}], None)
    text = "Sure. " + render_call("record", '{"note": "hi"}')
    for piece in [text[i : i + 3] for i in range(0, len(text), 3)]:
        logged += asm.feed(TextDelta(piece))
    logged += asm.close_open()
    types = [event["type"] for event in logged]
    assert types[-2:] == [mcp.MCP_CALL_ARGUMENTS_DONE, mcp.MCP_CALL_IN_PROGRESS]
    call = asm.pending_call()
    assert call is not None and call["arguments"] == '{"note": "hi"}'
    # a crash here: the call is in flight; the log rebuilds that exactly
    again = McpAssembler.rebuild(logged, offered)
    pending = again.pending_call()
    assert pending is not None and pending["id"] in again.sent
    assert [i["type"] for i in again.items] == ["mcp_list_tools", "message", "mcp_call"]
    logged += asm.result(call, "done", None)
    done = McpAssembler.rebuild(logged, offered)
    assert done.pending_call() is None and done.items[-1]["output"] == "done"
    assert done.items[-1]["status"] == "completed"
    # a call that needs an approval is an approval request, never sent
    asm2 = McpAssembler(offered, make_id=_ids())
    asm2.callable = frozenset(offered)
    events = asm2.feed(TextDelta(render_call("ask", "{}")))
    events += asm2.close_open()
    assert asm2.items[-1]["type"] == "mcp_approval_request" and asm2.pending_call() is None
    assert mcp.MCP_CALL_IN_PROGRESS not in [e["type"] for e in events]
