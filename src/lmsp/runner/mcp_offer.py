"""What one turn of an MCP loop offers the model, and what it may call.

- The tools: each listed tool that ``allowed_tools`` keeps, by the alias the model calls
  it by, its ``inputSchema`` checked under the service's compile budget (a worker
  process, ``LMSP_SCHEMA_CPU_TIME``, as a request's own schemas are): a keyword
  llguidance cannot enforce leaves the tool out; a schema past the budget fails the
  task (``schema_too_complex``), never a compile without a bound in the runner or the
  engine.
- A turn's grammar: ``tool_choice`` decides which tools it offers (none under
  ``"none"``; only functions under a named function or ``allowed_tools``, which name
  functions only; the forced server's on the first turn of ``{"type": "mcp", …}``),
  and none once ``max_tool_calls`` calls were made (MCP and function calls alike, the
  whole loop). The names it returns are all the assembler reads as calls: a turn that
  offers nothing is free text, and a ``<tool_call>`` the model writes there (an
  injected one it repeats) stays text.
- An approved call (``mcp_approval_response``) runs only if its tool is offered to this
  response, its arguments match the tool's ``inputSchema`` (the grammar's own check)
  and ``max_tool_calls`` is not reached.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lmsp.constraints import grammar
from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.base import EngineError
from lmsp.protocol import mcp
from lmsp.protocol.itemtypes import McpApprovalRequest, McpListTools
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.tools import FunctionTool, McpChoice, McpTool
from lmsp.runner.plan import callable_tools, offers_none, text_schema, tools_of

log = logging.getLogger(__name__)
Item = dict[str, Any]
#: calls one response makes when ``max_tool_calls`` does not say
DEFAULT_MAX_CALLS = 16
#: the items that count as calls against ``max_tool_calls``
CALLS = ("mcp_call", "mcp_approval_request", "function_call")


def call_limit(request: PreparedRequest) -> int:
    """``max_tool_calls``: the most calls the whole loop makes."""
    return request.max_tool_calls or DEFAULT_MAX_CALLS


def calls_in(items: Iterable[Item]) -> int:
    """How many of ``items`` are calls (:data:`CALLS`)."""
    return sum(1 for item in items if item.get("type") in CALLS)


# -- the tools ----------------------------------------------------------------------------------
def offer(
    lists: dict[str, McpListTools],
    servers: dict[str, McpTool],
    request: PreparedRequest,
    budget: GrammarBudget,
) -> dict[str, mcp.Offered]:
    """The MCP tools of ``lists`` (each server's latest list) the model may be offered,
    by the alias it calls them by."""
    taken = {tool.name for tool in request.tools or () if isinstance(tool, FunctionTool)}
    offered: dict[str, mcp.Offered] = {}
    for label, listed in lists.items():
        if listed.error:  # (unset: falsy)
            continue
        definition = servers[label]
        for tool in listed.tools:
            annotations = tool.get("annotations")
            annotations = annotations if isinstance(annotations, dict) else None
            if not mcp.allowed(definition, tool["name"], annotations):
                continue
            schema = mcp.closed(tool.get("input_schema") or {"type": "object"})
            if not enforceable(budget, label, tool["name"], schema):
                continue
            alias = mcp.alias_for(tool["name"], taken)
            offered[alias] = mcp.Offered(
                alias,
                label,
                tool["name"],
                tool.get("description"),
                schema,
                annotations,
                mcp.needs_approval(definition, tool["name"], annotations),
            )
    return offered


def enforceable(budget: GrammarBudget, label: str, name: str, schema: dict[str, Any]) -> bool:
    """Can the grammar hold calls of this tool to its ``inputSchema``? ``False``: a
    keyword llguidance cannot enforce (the tool is left out, logged);
    ``schema_too_complex`` past the compile budget."""
    outcome = budget.check_now(None, [schema])
    if outcome.kind == "unsupported":
        log.warning("MCP tool %s/%s left out: %s", label, name, outcome.problem[:300])
        return False
    if not outcome.ok:
        raise EngineError(
            "schema_too_complex",
            f"The inputSchema of the MCP tool {name!r} of {label!r} is too complex:"
            f" {budget.reason(outcome)}.",
        )
    return True


def checked(budget: GrammarBudget, text_grammar: str | None) -> str | None:
    """A turn's grammar, compiled once under the compile budget before the engine
    compiles it (its tools' schemas passed one by one; together they may not)."""
    if text_grammar is None:
        return None
    outcome = budget.check_now(text_grammar, [])
    if not outcome.ok:
        raise EngineError(
            "schema_too_complex",
            f"The tools offered to the model are too complex together: {budget.reason(outcome)}.",
        )
    return text_grammar


# -- a turn -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnTools:
    """A turn's grammar (``None``: free text), the tools its prompt shows and the names
    it may call (every other ``<tool_call>`` is text)."""

    grammar: str | None
    shown: list[dict[str, Any]]
    names: frozenset[str]


def callable_servers(
    request: PreparedRequest, offered: dict[str, mcp.Offered], made: int
) -> list[mcp.Offered]:
    """The MCP tools ``tool_choice`` lets the model call after ``made`` calls."""
    choice = request.tool_choice
    tools = list(offered.values())
    if choice in (None, "auto", "required"):
        return tools
    if isinstance(choice, McpChoice):
        if made > 0:
            return tools  # the forced call was the first; later turns are auto
        return [
            t
            for t in tools
            if t.server_label == choice.server_label and choice.name in (None, t.name)
        ]
    return []  # a named function or allowed_tools: functions only


def turn_tools(request: PreparedRequest, offered: dict[str, mcp.Offered], made: int) -> TurnTools:
    """What a turn after ``made`` calls offers (see the module docstring)."""
    schema = text_schema(request)
    if offers_none(request):
        return TurnTools(None if schema is None else grammar.json_grammar(schema), [], frozenset())
    functions, required = callable_tools(request)
    servers = callable_servers(request, offered, made)
    if isinstance(request.tool_choice, McpChoice):
        if made == 0:
            functions, required = [], bool(servers)
        else:
            required = False
    if made >= call_limit(request):
        functions, servers = [], []
    # "required": every turn calls a tool until max_tool_calls, then the answer
    shown = [*tools_of(request), *(mcp.function_of(t) for t in offered.values())]
    functions = [*functions, *(grammar.Function(t.alias, t.input_schema) for t in servers)]
    names = frozenset(f.name for f in functions)
    if functions:
        calls = grammar.calls_grammar(functions, required=required, limit=1, text_schema=schema)
        return TurnTools(calls, shown, names)
    if schema is not None:
        return TurnTools(grammar.json_grammar(schema), shown, frozenset())
    return TurnTools(None, shown, frozenset())


# -- approved calls -----------------------------------------------------------------------------
def refusal(
    request: PreparedRequest,
    offered: dict[str, mcp.Offered],
    made: int,
    wanted: McpApprovalRequest,
    budget: GrammarBudget,
) -> str | None:
    """Why the approved call ``wanted`` (its approval request) may not run after
    ``made`` calls, if it may not."""
    limit = call_limit(request)
    if made >= limit:
        return f"max_tool_calls ({limit}) calls were made"
    label, name = wanted.server_label, wanted.name
    tool = next((t for t in offered.values() if (t.server_label, t.name) == (label, name)), None)
    if tool is None:
        return f"the tool {name!r} of {label!r} is not offered to this response"
    try:
        arguments = json.loads(wanted.arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict) or not budget.accepts_now(
        grammar.json_grammar(tool.input_schema), json.dumps(arguments, ensure_ascii=False)
    ):
        return f"its arguments do not match the inputSchema of {name!r}"
    return None
