"""The MCP loop's items in a context (pure): read as input items (a follow-up's
``mcp_approval_response``, or earlier output given back as input) and rendered for the
model. An ``mcp_call`` shows as the call and its result (the output, or the error); an
``mcp_list_tools`` shows nothing (the tools are in the prompt's tool list); an
``mcp_approval_request`` shows nothing until it is answered: a refusal shows as the
call and the words that it was not run, an approval as nothing (the follow-up's
``mcp_call`` carries the call and its result).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from msgspec import UnsetType

from lmsp.errors import LmspError
from lmsp.protocol import mcp, toolcalls
from lmsp.protocol.fields import only_fields
from lmsp.protocol.itemtypes import (
    InputItem,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpToolCall,
)

Item = dict[str, Any]
INPUT_TYPES = frozenset(
    {"mcp_approval_response", "mcp_approval_request", "mcp_call", "mcp_list_tools"}
)
DECLINED = "The user did not approve this call; it was not run."

_KEYS = {
    "mcp_approval_response": {"type", "id", "approval_request_id", "approve", "reason"},
    "mcp_approval_request": {"type", "id", "server_label", "name", "arguments"},
    "mcp_call": {
        "type",
        "id",
        "server_label",
        "name",
        "arguments",
        "output",
        "error",
        "status",
        "approval_request_id",
    },
    "mcp_list_tools": {"type", "id", "server_label", "tools", "error"},
}


def _bad(where: str, message: str) -> LmspError:
    return LmspError("invalid_value", f"{where}: {message}", param=where)


def _text(item: Item, key: str, where: str, optional: bool = False) -> Any:
    value = item.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not value and key != "arguments"):
        raise _bad(f"{where}.{key}", "a non-empty string.")
    return value


def normalize(item: Item, kind: str, where: str, item_id: str) -> Item:
    """One MCP item of ``input`` (``400`` naming the field at fault)."""
    only_fields(item, _KEYS[kind], where, f"{kind} item")
    out: Item = {"type": kind, "id": item_id}
    if kind == "mcp_approval_response":
        out["approval_request_id"] = _text(item, "approval_request_id", where)
        if not isinstance(item.get("approve"), bool):
            raise _bad(f"{where}.approve", "true or false.")
        out["approve"] = item["approve"]
        if item.get("reason") is not None:
            out["reason"] = _text(item, "reason", where)
        return out
    out["server_label"] = _text(item, "server_label", where)
    if kind == "mcp_list_tools":
        tools = item.get("tools", [])
        if not isinstance(tools, list):
            raise _bad(f"{where}.tools", "a list of tools.")
        out["tools"] = tools
        if item.get("error") is not None:
            out["error"] = item["error"]
        return out
    out["name"] = _text(item, "name", where)
    out["arguments"] = _text(item, "arguments", where)
    if kind == "mcp_call":
        output = item.get("output")
        if output is not None and not isinstance(output, str):
            raise _bad(f"{where}.output", "a string.")
        out.update(output=output, error=item.get("error"), status=item.get("status") or "completed")
        if item.get("approval_request_id") is not None:
            out["approval_request_id"] = _text(item, "approval_request_id", where)
    return out


def _call(item: McpToolCall) -> str:
    arguments = item.arguments or "{}"
    try:
        shown = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        shown = json.dumps(arguments)
    return toolcalls.render_call(item.name, shown)


def _response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


def _result(call: McpCall) -> str:
    """What the model reads back from a finished ``mcp_call``: its output, or its error."""
    if call.error is not None and not isinstance(call.error, UnsetType):
        return "Error: " + mcp.error_text(call.error)
    return str(call.output or "")


def render(item: InputItem, requests: dict[str, McpApprovalRequest]) -> Iterator[tuple[str, str]]:
    """``(role, text)`` messages for one MCP item; ``requests`` collects the approval
    requests seen so far (an answer refers to one)."""
    if isinstance(item, McpApprovalRequest):
        requests[item.id] = item
    elif isinstance(item, McpCall):
        yield "assistant", _call(item)
        yield "user", _response(_result(item))
    elif isinstance(item, McpApprovalResponse) and not item.approve:
        asked = requests.get(item.approval_request_id)
        if asked is not None:
            yield "assistant", _call(asked)
            yield "user", _response(DECLINED)
