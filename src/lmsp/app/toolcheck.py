"""The policy for tools and structured output, shared by both APIs.

Both APIs check the request in its Responses form (a chat completion's ``tools``,
``tool_choice`` and ``response_format`` are translated first), with ``param`` names
given in the caller's own terms. :func:`problems` checks the shapes (pure, at once);
:func:`check_grammar` then compiles the request's schemas and grammar once, before
anything is written, under the budget of :mod:`lmsp.constraints.budget` (in a worker
process): a keyword llguidance cannot enforce is a ``400 unsupported_schema`` naming
it, a schema over the budget a ``400 schema_too_complex`` naming the limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec

from lmsp.app import tooldefs
from lmsp.constraints import gbnf, grammar, refs
from lmsp.constraints.budget import GrammarBudget, Outcome
from lmsp.errors import LmspError
from lmsp.fairgate import Ticket
from lmsp.protocol import mcp
from lmsp.protocol.request import RequestFields
from lmsp.protocol.tools import FunctionTool, mcp_tools
from lmsp.runner import relax
from lmsp.runner.plan import grammar_of

#: the ``param`` of a place in the Responses form: ``("tools", 0, "parameters")`` →
#: ``tools.0.parameters`` (or ``tools.0.function.parameters`` for a chat completion)
Param = Callable[..., str]


def responses_param(*parts: str | int) -> str:
    return ".".join(str(part) for part in parts)


def _schema(schema: Any, where: str, what: str) -> Iterator[LmspError]:
    if not isinstance(schema, dict):
        yield LmspError("invalid_value", f"{what} must be a JSON Schema object.", param=where)
        return
    try:
        looped = refs.endless_ref(schema)
    except RecursionError:  # nested too deeply: the compile's budget refuses it
        looped = None
    if looped is not None:
        yield LmspError(
            "unsupported_schema",
            f"{what}: a recursive $ref through required members has no finite instance"
            " (make the recursion optional, e.g. a property not required).",
            param=f"{where}.{looped}",
        )


# -- the compile, under its budget ----------------------------------------------------------
Schemas = list[tuple[dict[str, Any], tuple[str | int, ...]]]


def schemas_of(request: RequestFields) -> Schemas:
    """Every JSON Schema of a request, with where it sits in its Responses form: each
    function tool's ``parameters`` (the part of them the grammar enforces, if some were
    relaxed), then ``text.format.schema``."""
    found: Schemas = []
    for index, tool in enumerate(request.tools or ()):
        if not isinstance(tool, FunctionTool):
            continue
        parameters = tool.enforced if tool.enforced is not None else tool.parameters
        if isinstance(parameters, dict):
            found.append((parameters, ("tools", index, "parameters")))
    fmt = request.text.format if request.text is not None else None
    if fmt is not None and fmt.type == "json_schema" and isinstance(fmt.schema, dict):
        found.append((fmt.schema, ("text", "format", "schema")))
    return found


R = TypeVar("R", bound=RequestFields)


async def check_grammar(
    budget: GrammarBudget,
    request: R,
    param: Param = responses_param,
    ticket: Ticket | None = None,
) -> R:
    """Compile the schemas and the output grammar of a request under ``budget`` and the
    request's ``ticket``; raise the refusal if they do not fit. A keyword llguidance
    cannot enforce in a tool that is not ``strict`` is relaxed instead
    (:mod:`lmsp.runner.relax`: left out of the grammar, checked after generation) and
    the compile tried again: the request given back holds the relaxed tools."""
    for _ in range(relax.MAX_RELAXED + 1):
        schemas = schemas_of(request)
        try:
            text_grammar, _ = grammar_of(request)
        except RecursionError:  # a schema nested deeper than JSON can be written back
            outcome = Outcome("too_complex", limit="depth")
        else:
            outcome = await budget.check(text_grammar, [schema for schema, _ in schemas], ticket)
        if outcome.ok:
            return request
        relaxed = _relaxed(outcome, schemas, request)
        if relaxed is None:
            break
        request = relaxed
    raise _refusal(outcome, schemas, request, budget, param, ticket)


def _relaxed(outcome: Outcome, schemas: Schemas, request: R) -> R | None:
    """``request`` with the keyword ``outcome`` names relaxed, if it is in a tool that
    is not strict."""
    if outcome.kind != "unsupported" or outcome.schema is None:
        return None
    schema, place = schemas[outcome.schema]
    if place[0] != "tools":
        return None
    tools = list(request.tools or ())
    tool = tools[int(place[1])]
    assert isinstance(tool, FunctionTool)
    found = grammar.unsupported(schema, outcome.problem)
    if tool.is_strict:
        return None
    relaxed = relax.relax(tool, found.path)
    if relaxed is None:
        return None
    tools[int(place[1])] = relaxed
    return msgspec.structs.replace(request, tools=tuple(tools))


def _caller_place(request: RequestFields, place: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """A stored place (``tools.5.parameters``) in the caller's list (``tools.4.tools.1…``)."""
    if place[0] != "tools":
        return place
    return (*tooldefs.places(request.tools or ())[int(place[1])], *place[2:])


def refuse_constraints(request: RequestFields, model: str, param: Param) -> None:
    """A model whose engine cannot hold its output to a grammar (the test engine) is
    asked for tools or a schema: ``400``, not a task that fails."""
    text_grammar, _ = grammar_of(request)
    if text_grammar is None and not mcp_tools(request.tools):
        return
    where = param("tools") if request.tools else param("text", "format", "schema")
    raise LmspError(
        "unsupported_parameter",
        f"The model {model!r} cannot constrain its output (tools or a JSON schema).",
        param=where,
    )


def refuse_beyond_json(request: RequestFields, model: str, param: Param) -> None:
    """A model whose upstream holds output only to GBNF grammars is asked for tools, or
    for a schema :mod:`lmsp.constraints.gbnf` cannot write exactly: ``400``."""
    text_grammar, calls = grammar_of(request)
    if calls or mcp_tools(request.tools):
        raise LmspError(
            "unsupported_parameter",
            f"The model {model!r} can hold its output to a JSON schema only (its upstream"
            " runs GBNF grammars, not llguidance): tools cannot be constrained.",
            param=param("tools"),
        )
    if text_grammar is None:
        return
    try:
        gbnf.from_llguidance(text_grammar)
    except grammar.UnsupportedSchema as exc:
        where = param("text", "format", "schema")
        raise LmspError(
            "unsupported_schema",
            f"The schema cannot be enforced on the upstream of {model!r} (GBNF): {exc.message}",
            param=f"{where}.{exc.path}" if exc.path else where,
        ) from None


def _refusal(
    outcome: Outcome,
    schemas: Schemas,
    request: RequestFields,
    budget: GrammarBudget,
    param: Param,
    ticket: Ticket | None = None,
) -> LmspError:
    if outcome.kind == "unsupported" and outcome.schema is not None:
        schema, place = schemas[outcome.schema]
        where = param(*_caller_place(request, place))
        found = grammar.unsupported(schema, outcome.problem)
        what = "The schema"
        if place[0] == "tools":
            tool = (request.tools or ())[int(place[1])]
            assert isinstance(tool, FunctionTool)
            what = f"The parameters of {tool.name!r}"
            if tool.is_strict:
                found = grammar.UnsupportedSchema(
                    found.message + " (a tool that is not strict has it checked after"
                    " generation instead)",
                    found.path,
                )
        return LmspError(
            "unsupported_schema",
            f"{what}: {found.message}",
            param=f"{where}.{found.path}" if found.path else where,
        )
    if outcome.schema is not None:
        where = param(*_caller_place(request, schemas[outcome.schema][1]))
    elif len(schemas) == 1:
        where = param(*_caller_place(request, schemas[0][1]))
    elif any(place[0] == "tools" for _, place in schemas):
        where = param("tools")
    else:
        where = param("text", "format", "schema")
    reason = budget.reason(outcome, ticket.cpu_seconds if ticket is not None else 0.0)
    return LmspError(
        "schema_too_complex", f"The request's JSON Schemas are too complex: {reason}.", param=where
    )


def problems(
    tools: list[dict[str, Any]],
    choice: Any,
    fmt: dict[str, Any] | None,
    stop: Any,
    param: Param = responses_param,
    *,
    mcp_tools: bool = False,
) -> Iterator[LmspError]:
    """Every refusal of the tools, ``tool_choice`` and text format of a request
    (``mcp_tools``: MCP servers may be among the tools: ``/v1/responses``)."""
    names: set[str] = set()
    if mcp_tools:
        yield from mcp.problems(tools, choice, param)
    for place, tool in zip(tooldefs.places(tools), tools, strict=True):
        kind = tool.get("type")
        if kind == mcp.MCP and mcp_tools:
            continue
        if kind != "function":
            if tool.get("offered") is False:
                continue  # a hosted tool lmsp cannot run, not offered (lmsp.protocol.tools.HOSTED)
            yield LmspError(
                "unsupported_parameter",
                f"Tool type {kind!r} is not supported here; only function tools are.",
                param=param(*place, "type"),
            )
            continue
        name = tool.get("name")
        if not name:
            yield LmspError(
                "invalid_value",
                "A function tool needs a name.",
                param=param(*place, "name"),
            )
            continue
        if name in names:
            yield LmspError(
                "invalid_value",
                f"Two tools are named {name!r}.",
                param=param(*place, "name"),
            )
        names.add(name)
        parameters = tool.get("parameters")
        if parameters is not None:
            where = param(*place, "parameters")
            if isinstance(parameters, dict) and parameters.get("type", "object") != "object":
                yield LmspError(
                    "unsupported_schema",
                    "A function's parameters must be an object schema.",
                    param=f"{where}.type",
                )
            else:
                yield from _schema(parameters, where, f"The parameters of {name!r}")
    servers = any(tool.get("type") == mcp.MCP for tool in tools) and mcp_tools
    if not (servers and choice == "required"):
        yield from _choice(choice, names, param)
    calls = (bool(names) or servers) and choice != "none"
    if fmt is not None and fmt.get("type") == "json_schema":
        if fmt.get("schema") is None:
            yield LmspError(
                "invalid_value",
                "A json_schema format needs its schema.",
                param=param("text", "format", "schema"),
            )
        else:
            yield from _schema(fmt["schema"], param("text", "format", "schema"), "The schema")
    structured = fmt is not None and fmt.get("type") in ("json_schema", "json_object")
    if stop and (calls or structured):
        yield LmspError(
            "unsupported_parameter",
            "Stop sequences cannot be combined with tool calls or structured output.",
            param=param("stop"),
        )


def _choice(choice: Any, names: set[str], param: Param) -> Iterator[LmspError]:
    if choice in (None, "none", "auto"):
        return
    if choice == "required":
        if not names:
            yield LmspError(
                "invalid_value", 'tool_choice "required" needs tools.', param=param("tool_choice")
            )
        return
    if not isinstance(choice, dict):
        return  # the body's own validation has refused it
    kind = choice.get("type")
    if kind == mcp.MCP and "server_label" in choice:
        return  # an MCP server's tool (mcp.problems); read only for /v1/responses
    if kind == "function":
        if choice.get("name") not in names:
            yield LmspError(
                "invalid_value",
                f"tool_choice names {choice.get('name')!r}, which is not in tools.",
                param=param("tool_choice", "name"),
            )
        return
    if kind == "allowed_tools":
        allowed = choice.get("tools") or []
        for index, tool in enumerate(allowed):
            if tool.get("type") != "function":
                yield LmspError(
                    "unsupported_parameter",
                    f"Tool type {tool.get('type')!r} is not supported here.",
                    param=param("tool_choice", "tools", index, "type"),
                )
            elif tool.get("name") not in names:
                yield LmspError(
                    "invalid_value",
                    f"allowed_tools names {tool.get('name')!r}, which is not in tools.",
                    param=param("tool_choice", "tools", index, "name"),
                )
        if not allowed:
            yield LmspError(
                "invalid_value", "allowed_tools needs tools.", param=param("tool_choice", "tools")
            )
        return
    yield LmspError(
        "unsupported_parameter",
        f"tool_choice type {kind!r} is not supported here; only function tools are.",
        param=param("tool_choice", "type"),
    )


# -- Chat Completions: the same fields in their chat form ---------------------------------
# (``tools`` and ``tool_choice`` are read into the Responses form by :mod:`.tooldefs`)
def chat_format(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat ``response_format`` as a Responses ``text.format``."""
    if response_format is None or response_format.get("type") != "json_schema":
        return response_format
    given = response_format.get("json_schema") or {}
    shown = {"type": "json_schema"}
    for key in ("name", "description", "schema", "strict"):
        if given.get(key) is not None:
            shown[key] = given[key]
    return shown


_CHAT_PLACES = {
    ("tool_choice", "name"): "tool_choice.function.name",
    ("text", "format", "schema"): "response_format.json_schema.schema",
}


def chat_param(*parts: str | int) -> str:
    """The chat name of a place in the Responses form."""
    if parts[:2] == ("tool_choice", "tools"):
        named = ("function", *parts[3:]) if parts[3:] == ("name",) else parts[3:]
        return responses_param("tool_choice", "allowed_tools", *parts[1:3], *named)
    if parts and parts[0] == "tools" and len(parts) > 2 and parts[2] != "type":
        return responses_param("tools", parts[1], "function", *parts[2:])
    return _CHAT_PLACES.get(tuple(parts), responses_param(*parts))  # type: ignore[arg-type]
