"""MCP tools in a Responses request (pure): their definitions read and checked, the
hosts they may reach, their header values kept out of what is stored and shown, the
names the model calls them by, which calls need an approval, and the items and events
of the loop (OpenAI's shapes: ``mcp_list_tools``, ``mcp_call``, ``mcp_approval_request``,
``response.mcp_call.*``, ``response.mcp_list_tools.*``).

A tool ``{"type": "mcp", "server_label", "server_url", "allowed_tools"?, "headers"?,
"require_approval"?, "server_description"?, "authorization"?}``: lmsp is the MCP client
(:mod:`lmsp.outbound.mcp_client`) and runs the loop in the task (:mod:`lmsp.runner.mcp_loop`).
``connector_id`` (OpenAI's hosted connectors) is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.protocol import outbound
from lmsp.protocol.tools import McpTool, Tool, ToolFilter

MCP = "mcp"
REDACTED = "[redacted]"
LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_HEADERS = 32
#: the most tools of one server a response offers (and stores in its list item), after
#: ``allowed_tools``: a server listing more fails its list step
MAX_TOOLS = 128
APPROVALS = ("always", "never")

# events (OpenAI's names)
MCP_CALL_ARGUMENTS_DELTA = "response.mcp_call_arguments.delta"
MCP_CALL_ARGUMENTS_DONE = "response.mcp_call_arguments.done"
MCP_CALL_IN_PROGRESS = "response.mcp_call.in_progress"
MCP_CALL_COMPLETED = "response.mcp_call.completed"
MCP_CALL_FAILED = "response.mcp_call.failed"
MCP_LIST_TOOLS_IN_PROGRESS = "response.mcp_list_tools.in_progress"
MCP_LIST_TOOLS_COMPLETED = "response.mcp_list_tools.completed"
MCP_LIST_TOOLS_FAILED = "response.mcp_list_tools.failed"
EVENTS = frozenset(
    {
        MCP_CALL_ARGUMENTS_DELTA,
        MCP_CALL_ARGUMENTS_DONE,
        MCP_CALL_IN_PROGRESS,
        MCP_CALL_COMPLETED,
        MCP_CALL_FAILED,
        MCP_LIST_TOOLS_IN_PROGRESS,
        MCP_LIST_TOOLS_COMPLETED,
        MCP_LIST_TOOLS_FAILED,
    }
)
#: the error of a call in flight at a crash whose tool may not be sent twice
INTERRUPTED = "interrupted by a restart; not repeated"


def _bad(where: str, message: str, code: str = "invalid_value") -> LmspError:
    return LmspError(code, f"{where}: {message}", param=where)


# -- the tool definition --------------------------------------------------------------------
def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise _bad(where, "a list of tool names.")
    if len(value) > 256:
        raise _bad(where, "at most 256 tool names.")
    return list(value)


def _filter(value: Any, where: str) -> dict[str, Any]:
    """``{"tool_names"?, "read_only"?}`` (OpenAI's ``McpToolFilter``)."""
    if not isinstance(value, dict):
        raise _bad(where, "a list of tool names or {tool_names, read_only}.")
    out: dict[str, Any] = {}
    for key, inner in value.items():
        if key == "tool_names":
            out["tool_names"] = _names(inner, f"{where}.tool_names")
        elif key == "read_only":
            if not isinstance(inner, bool):
                raise _bad(f"{where}.read_only", "true or false.")
            out["read_only"] = inner
        else:
            raise _bad(f"{where}.{key}", f"a tool filter has no field {key!r}.")
    return out


def read_tool(given: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``mcp`` tool as the store keeps it (header values still in it: the caller
    takes them out with :func:`take_headers`)."""
    tool: dict[str, Any] = {"type": MCP}
    label = given.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise _bad(f"{where}.server_label", "1 to 64 letters, digits, underscores or dashes.")
    tool["server_label"] = label
    if given.get("connector_id") is not None:
        raise _bad(
            f"{where}.connector_id",
            "connectors are not available here: give a server_url.",
            "unsupported_parameter",
        )
    url = given.get("server_url")
    if not isinstance(url, str) or not url:
        raise _bad(f"{where}.server_url", "an MCP tool needs its server_url.")
    tool["server_url"] = url
    for key in ("server_description",):
        if given.get(key) is not None:
            if not isinstance(given[key], str):
                raise _bad(f"{where}.{key}", "a string.")
            tool[key] = given[key]
    allowed = given.get("allowed_tools")
    if allowed is not None:
        place = f"{where}.allowed_tools"
        tool["allowed_tools"] = (
            _names(allowed, place) if isinstance(allowed, list) else _filter(allowed, place)
        )
    approval = given.get("require_approval")
    if approval is not None:
        tool["require_approval"] = _approval(approval, f"{where}.require_approval")
    headers = _headers(given, where)
    if headers:
        tool["headers"] = headers
    for key in given:
        if key not in {
            "type",
            "server_label",
            "server_url",
            "server_description",
            "allowed_tools",
            "require_approval",
            "headers",
            "authorization",
            "connector_id",
            "defer_loading",
        }:
            raise _bad(f"{where}.{key}", f"an mcp tool has no field {key!r}.")
    if given.get("defer_loading"):
        raise _bad(
            f"{where}.defer_loading", "tools are always loaded here.", "unsupported_parameter"
        )
    return tool


def _approval(approval: Any, place: str) -> str | dict[str, Any]:
    """``require_approval``: ``"always"``, ``"never"`` or ``{always?, never?}`` filters."""
    if isinstance(approval, str):
        if approval not in APPROVALS:
            raise _bad(place, '"always", "never", or {always, never}.')
        return approval
    if not isinstance(approval, dict):
        raise _bad(place, '"always", "never", or {always, never}.')
    shown: dict[str, Any] = {}
    for key, inner in approval.items():
        if key not in APPROVALS:
            raise _bad(f"{place}.{key}", "only always and never filters exist.")
        shown[key] = _filter(inner, f"{place}.{key}")
    return shown


def _headers(given: dict[str, Any], where: str) -> dict[str, str]:
    """The header values of ``headers`` and ``authorization`` (a bearer token)."""
    headers: dict[str, str] = {}
    given_headers = given.get("headers")
    if given_headers is not None:
        place = f"{where}.headers"
        if not isinstance(given_headers, dict) or len(given_headers) > MAX_HEADERS:
            raise _bad(place, f"an object of at most {MAX_HEADERS} string values.")
        for name, value in given_headers.items():
            if not isinstance(value, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
                raise _bad(f"{place}.{name}", "a header name and a string value.")
            if "\n" in value or "\r" in value:
                raise _bad(f"{place}.{name}", "a header value is one line.")
            headers[name] = value
    authorization = given.get("authorization")
    if authorization is not None:
        if not isinstance(authorization, str) or not authorization:
            raise _bad(f"{where}.authorization", "a string (an OAuth access token).")
        headers["Authorization"] = f"Bearer {authorization}"
    return headers


def read_choice(given: dict[str, Any]) -> dict[str, Any]:
    """``tool_choice: {"type": "mcp", "server_label", "name"?}``."""
    label = given.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise _bad("tool_choice.server_label", "the server_label of an mcp tool.")
    choice: dict[str, Any] = {"type": MCP, "server_label": label}
    name = given.get("name")
    if name is not None:
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.name", "a tool name.")
        choice["name"] = name
    return choice


def take_headers(tools: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Take every MCP tool's header values out of ``tools`` as read (they are shown as
    ``[redacted]``): ``{server_label: headers}``, to keep apart from the request."""
    kept: dict[str, dict[str, str]] = {}
    for tool in tools:
        headers = tool.get("headers") if tool.get("type") == MCP else None
        if headers:
            kept[tool["server_label"]] = dict(headers)
            tool["headers"] = {name: REDACTED for name in headers}
    return kept


def problems(tools: list[dict[str, Any]], choice: Any, param: Any) -> Iterator[LmspError]:
    """Cross-tool refusals of the MCP tools (labels unique, a ``tool_choice`` naming one)."""
    labels: set[str] = set()
    if isinstance(choice, dict) and choice.get("type") == MCP:
        known = {t.get("server_label") for t in tools if t.get("type") == MCP}
        if choice.get("server_label") not in known:
            yield LmspError(
                "invalid_value",
                f"tool_choice names the MCP server {choice.get('server_label')!r},"
                " which is not in tools.",
                param=param("tool_choice", "server_label"),
            )
    for index, tool in enumerate(tools):
        if tool.get("type") != MCP:
            continue
        label = tool["server_label"]
        if label in labels:
            yield LmspError(
                "invalid_value",
                f"Two MCP tools have the server_label {label!r}.",
                param=param("tools", index, "server_label"),
            )
        labels.add(label)


# -- hosts --------------------------------------------------------------------------------
def host_rules(allowed: Iterable[str]) -> tuple[outbound.HostRule, ...]:
    """``LMSP_MCP_HOSTS`` (``allowed``: its ``host`` or ``host:port`` entries) as the
    rule of :mod:`lmsp.protocol.outbound`."""
    return outbound.parse_hosts(",".join(allowed), "LMSP_MCP_HOSTS")


def host_allowed(url: str, allowed: Iterable[str]) -> bool:
    """May lmsp reach ``url``? The rule webhooks follow (:mod:`lmsp.protocol.outbound`)
    under ``LMSP_MCP_HOSTS`` (``allowed``: its ``host`` or ``host:port`` entries). The
    connection itself goes only to an address the rule admits."""
    return outbound.allows(url, host_rules(allowed))


def check_hosts(tools: Sequence[Tool], allowed: Iterable[str]) -> None:
    """``400 invalid_mcp_server`` for a server URL lmsp may not reach."""
    hosts = list(allowed)
    for index, tool in enumerate(tools):
        if isinstance(tool, McpTool) and not host_allowed(tool.server_url, hosts):
            raise LmspError(
                "invalid_mcp_server",
                f"tools.{index}.server_url: only http(s) URLs on loopback hosts are allowed"
                " (LMSP_MCP_HOSTS lists more).",
                param=f"tools.{index}.server_url",
            )


# -- tools offered, names, approvals ---------------------------------------------------------
def allowed(tool_def: McpTool, name: str, annotations: dict[str, Any] | None) -> bool:
    """Is the server's tool ``name`` among the definition's ``allowed_tools``?"""
    rule = tool_def.allowed_tools
    if rule is None:
        return True
    if isinstance(rule, tuple):
        return name in rule
    return _matches(rule, name, annotations)


def _matches(rule: ToolFilter, name: str, annotations: dict[str, Any] | None) -> bool:
    if rule.tool_names is not None and name not in rule.tool_names:
        return False
    if rule.read_only is not None:
        return bool((annotations or {}).get("readOnlyHint")) is rule.read_only
    return True


def needs_approval(tool_def: McpTool, name: str, annotations: dict[str, Any] | None) -> bool:
    """Does a call of ``name`` wait for an approval? OpenAI's default is ``always``."""
    rule = tool_def.require_approval or "always"
    if isinstance(rule, str):
        return rule == "always"
    if rule.never is not None and _matches(rule.never, name, annotations):
        return False
    if rule.always is not None and _matches(rule.always, name, annotations):
        return True
    # unmatched: the default (always) when a never filter says which need none; none
    # when only an always filter says which need one
    return rule.never is not None


def repeatable(annotations: dict[str, Any] | None) -> bool:
    """May a call whose outcome is unknown be sent again (read-only or idempotent)?"""
    given = annotations or {}
    return bool(given.get("readOnlyHint") or given.get("idempotentHint"))


@dataclass(frozen=True)
class Offered:
    """A server's tool as the model sees it: ``alias`` is its name in the prompt."""

    alias: str
    server_label: str
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None
    approval: bool


def alias_for(name: str, taken: set[str]) -> str:
    """A name the call grammar accepts, unique among ``taken``."""
    base = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"
    alias, number = base, 1
    while alias in taken:
        number += 1
        suffix = f"_{number}"
        alias = base[: 64 - len(suffix)] + suffix
    taken.add(alias)
    return alias


def closed(schema: Any) -> Any:
    """``schema`` with every object that does not say otherwise closed to the properties
    it names (``additionalProperties: false``, as OpenAI's strict mode does): a small
    model held to an open object writes keys until its budget runs out."""
    if isinstance(schema, list):
        return [closed(inner) for inner in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema and isinstance(schema["properties"], dict):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def function_of(tool: Offered) -> dict[str, Any]:
    """The tool as a function definition (what the prompt shows)."""
    shown: dict[str, Any] = {"type": "function", "name": tool.alias}
    if tool.description:
        shown["description"] = tool.description
    shown["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
    return shown


# -- items ------------------------------------------------------------------------------------
def list_item(item_id: str, label: str) -> dict[str, Any]:
    return {"type": "mcp_list_tools", "id": item_id, "server_label": label, "tools": []}


def listed_tool(tool: Any) -> dict[str, Any]:
    """An MCP ``Tool`` (a dict of its JSON) as an ``mcp_list_tools`` entry."""
    shown: dict[str, Any] = {"name": tool["name"], "input_schema": tool.get("inputSchema") or {}}
    if tool.get("description"):
        shown["description"] = tool["description"]
    shown["annotations"] = tool.get("annotations")
    return shown


def too_many_tools(count: int) -> str:
    """The list step's error for a server that lists more than :data:`MAX_TOOLS`."""
    return (
        f"Listing the tools failed: the server lists {count} tools; at most {MAX_TOOLS} are"
        " offered (name the ones to offer in allowed_tools)."
    )


def error_of(kind: str, message: str, code: int = -32000) -> dict[str, Any]:
    """An ``mcp_call`` error (OpenAI's ``McpToolCallError``)."""
    if kind == "mcp_tool_execution_error":
        return {"type": kind, "content": [{"type": "text", "text": message}]}
    return {"type": kind, "code": code, "message": message}


def error_text(error: Any) -> str:
    """An ``mcp_call``'s error as the model reads it."""
    if isinstance(error, str):
        return error
    if not isinstance(error, dict):
        return "the call failed"
    if "message" in error:
        return str(error["message"])
    texts = [c.get("text", "") for c in error.get("content") or [] if isinstance(c, dict)]
    return " ".join(t for t in texts if t) or "the tool failed"


def arguments_json(arguments: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
