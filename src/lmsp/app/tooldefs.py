"""Tool definitions and ``tool_choice``, read once for both APIs (pure).

``/v1/responses`` and ``/v1/chat/completions`` spell the same things two ways: a tool is
``{"type": "function", "name", …}`` in one and ``{"type": "function", "function":
{"name", …}}`` in the other, and so on for ``tool_choice``. Both bodies declare these
fields as plain JSON; this module reads them, whatever the dialect, with one set of
rules, into the Responses form the store keeps and :mod:`.toolcheck` judges. A value of
the wrong shape is a ``400 invalid_value`` whose ``param`` names the exact place in the
caller's own spelling (``tools.0.function.name``, ``tool_choice.allowed_tools.tools.1``),
before anything is written: a malformed tool never reaches a code path that would choke
on it.

What is read: a tool's ``type`` (a short string; only ``function`` tools are kept in
full, other types are kept as ``{"type"}`` for :mod:`.toolcheck` to refuse), its
``name`` (1 to 64 letters, digits, ``_`` or ``-``: the one rule both APIs use, the one
OpenAI documents), ``description`` (text), ``parameters`` (an object) and ``strict`` (a
boolean); ``tool_choice`` as ``"none"``, ``"auto"``, ``"required"``, a named function or
``allowed_tools`` (``mode`` and a list of 1 to 128 named tools). Fields neither API
defines are ignored, as the bodies' own unknown fields are.

Each tool ``type`` has one reader in :data:`KINDS` (the one place to add a tool type):

- ``function``: kept in full.
- ``namespace`` (Responses only; a group of function tools, as Codex CLI sends its
  multi-agent tools): flattened into its function tools, each marked with its
  ``namespace`` so that a call names it again (``{"type": "function_call", "name",
  "namespace"}``, as OpenAI returns it); a tool's name stays its own, so two tools of the
  same name (in two namespaces, or one plain) are refused as any two tools are.
- a hosted tool lmsp cannot run (:data:`lmsp.protocol.tools.HOSTED`: ``web_search``,
  ``file_search``, ``code_interpreter``, …) or a ``custom`` tool (free-form input; in a
  namespace too): kept as ``{"type", "offered": false}``. Under
  ``tool_choice`` ``"auto"``, ``"required"`` or ``"none"`` it is not offered to the model
  (the response's ``tools`` shows it so); a ``tool_choice`` that forces it is refused by
  :mod:`.toolcheck`.
- any other type is kept as ``{"type"}`` for :mod:`.toolcheck` to refuse.

:func:`places` gives each read tool's place in the caller's own list (a namespace's
third tool is ``tools.4.tools.2``) for the errors' ``param``. Tools may also come in
``additional_tools`` input items (:func:`request_tools`; Codex CLI sends its tools so
for the models it knows): they are read alike and added to the request's ``tools``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.protocol import mcp
from lmsp.protocol.tools import UNOFFERED, Tool

#: a function tool's name: what OpenAI documents for both APIs
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_TYPE = 64
MAX_ALLOWED = 128
CHOICES = ("none", "auto", "required")
MODES = ("none", "auto", "required")


@dataclass(frozen=True)
class Dialect:
    """Where a dialect keeps a function's fields: directly (``""``, Responses) or in an
    object under a key (``"function"``, Chat Completions)."""

    wrapper: str
    #: where ``allowed_tools``' mode and tools sit inside the choice
    allowed: str
    #: a function tool is not strict unless it says so (Chat Completions' default)
    lenient: bool = False


RESPONSES = Dialect(wrapper="", allowed="")
CHAT = Dialect(wrapper="function", allowed="allowed_tools", lenient=True)


def _bad(where: str, message: str) -> LmspError:
    return LmspError("invalid_value", f"{where}: {message}", param=where)


def _at(*parts: str | int) -> str:
    return ".".join(str(part) for part in parts if part != "")


def _object(value: Any, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, f"{what} must be a JSON object.")
    return value


def _type(given: dict[str, Any], where: str) -> str:
    kind = given.get("type")
    if kind is None:
        raise _bad(_at(where, "type"), "a type is required.")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE:
        raise _bad(_at(where, "type"), f"a string of 1 to {MAX_TYPE} characters.")
    return kind


def _name(value: Any, where: str) -> str:
    if value is None:
        raise _bad(where, "a function name is required.")
    if not isinstance(value, str):
        raise _bad(where, "a function name must be a string.")
    if not NAME.fullmatch(value):
        raise _bad(where, "a function name is 1 to 64 letters, digits, underscores or dashes.")
    return value


def _function(given: dict[str, Any], where: str, dialect: Dialect) -> dict[str, Any]:
    """The function fields of a tool (``where`` is the tool's place)."""
    if dialect.wrapper:
        where = _at(where, dialect.wrapper)
        given = _object(given.get(dialect.wrapper), where, "a function tool's function")
    tool: dict[str, Any] = {
        "type": "function",
        "name": _name(given.get("name"), _at(where, "name")),
    }
    description = given.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _bad(_at(where, "description"), "a string.")
        tool["description"] = description
    parameters = given.get("parameters")
    if parameters is not None:
        tool["parameters"] = _object(parameters, _at(where, "parameters"), "parameters")
    strict = given.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise _bad(_at(where, "strict"), "true or false.")
        tool["strict"] = strict
    elif dialect.lenient:
        tool["strict"] = False
    return tool


#: a tool type's reader: ``(the tool as given, its place, the dialect)`` → the tools it
#: stands for, in the Responses form the store keeps
Reader = Callable[[dict[str, Any], str, Dialect], list[dict[str, Any]]]


def _read_function(given: dict[str, Any], where: str, dialect: Dialect) -> list[dict[str, Any]]:
    return [_function(given, where, dialect)]


def _read_namespace(given: dict[str, Any], where: str, dialect: Dialect) -> list[dict[str, Any]]:
    if dialect.wrapper:  # Chat Completions has no namespaces
        return [{"type": "namespace"}]
    name = _name(given.get("name"), _at(where, "name"))
    tools = given.get("tools")
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_ALLOWED:
        raise _bad(_at(where, "tools"), f"a namespace holds a list of 1 to {MAX_ALLOWED} tools.")
    out = []
    for index, item in enumerate(tools):
        inner = _at(where, "tools", index)
        tool = _object(item, inner, "a tool")
        kind = _type(tool, inner)
        if kind in UNOFFERED:
            out.append({"type": kind, "namespace": name, "offered": False})
        elif kind == "function":
            out.append({**_function(tool, inner, dialect), "namespace": name})
        else:
            raise _bad(_at(inner, "type"), "a namespace holds function tools only.")
    return out


def _read_hosted(given: dict[str, Any], where: str, dialect: Dialect) -> list[dict[str, Any]]:
    return [{"type": given["type"], "offered": False}]


#: every tool type lmsp reads (add a type here, and its check in :mod:`.toolcheck`)
KINDS: dict[str, Reader] = {
    "function": _read_function,
    "namespace": _read_namespace,
    **dict.fromkeys(UNOFFERED, _read_hosted),
}


def request_tools(tools: Any, given_input: Any, dialect: Dialect) -> list[dict[str, Any]] | None:
    """A request's tools: its ``tools``, then those of its ``additional_tools`` input
    items (Codex CLI gives its tools so), read alike (``None``: none given)."""
    out = None if tools is None else read_tools(tools, dialect)
    if not isinstance(given_input, list):
        return out
    for index, item in enumerate(given_input):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            where = _at("input", index, "tools")
            out = [*(out or []), *read_tools(item.get("tools"), dialect, where)]
    return out


def places(tools: Sequence[dict[str, Any] | Tool]) -> list[tuple[str | int, ...]]:
    """Each read tool's place in the caller's list: ``("tools", 4)``, or ``("tools", 4,
    "tools", 2)`` for a namespace's third tool (a namespace's tools are read in a row);
    the tools as read, or typed."""
    out: list[tuple[str | int, ...]] = []
    index, inner, group = -1, 0, None
    for tool in tools:
        if isinstance(tool, dict):
            namespace = tool.get("namespace")
        else:
            namespace = getattr(tool, "namespace", None)
        if namespace is not None and namespace == group:
            inner += 1
        else:
            index, inner, group = index + 1, 0, namespace
        out.append(("tools", index) if namespace is None else ("tools", index, "tools", inner))
    return out


def read_tools(value: Any, dialect: Dialect, place: str = "tools") -> list[dict[str, Any]]:
    """``tools`` (a list, or ``None``) in the Responses form (``place``: where the
    list is, for errors)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(place, "a list of tools.")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = _at(place, index)
        given = _object(item, where, "a tool")
        kind = _type(given, where)
        if kind == mcp.MCP and dialect is RESPONSES:  # an MCP server (protocol/mcp.py)
            out.append(mcp.read_tool(given, where))
            continue
        reader = KINDS.get(kind)
        out.extend([{"type": kind}] if reader is None else reader(given, where, dialect))
    return out


def _named(given: dict[str, Any], where: str, dialect: Dialect) -> dict[str, Any]:
    """A named tool (``tool_choice`` itself, or one of ``allowed_tools``)."""
    kind = _type(given, where)
    if kind != "function":
        return {"type": kind}
    if dialect.wrapper:
        where = _at(where, dialect.wrapper)
        given = _object(given.get(dialect.wrapper), where, "a named function")
    return {"type": "function", "name": _name(given.get("name"), _at(where, "name"))}


def read_choice(value: Any, dialect: Dialect) -> str | dict[str, Any] | None:
    """``tool_choice`` in the Responses form."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in CHOICES:
            raise _bad("tool_choice", f'{value!r} is not one of "none", "auto", "required".')
        return value
    given = _object(value, "tool_choice", 'tool_choice, when not "none", "auto" or "required",')
    kind = _type(given, "tool_choice")
    if kind == "function":
        return _named(given, "tool_choice", dialect)
    if kind == mcp.MCP and dialect is RESPONSES:  # {"type": "mcp", "server_label", "name"?}
        return mcp.read_choice(given)
    if kind != "allowed_tools":
        return {"type": kind}
    where = _at("tool_choice", dialect.allowed)
    holder = given
    if dialect.allowed:
        holder = _object(given.get(dialect.allowed), where, "allowed_tools")
    choice: dict[str, Any] = {"type": "allowed_tools"}
    mode = holder.get("mode")
    if mode is not None:
        if mode not in MODES:
            raise _bad(_at(where, "mode"), 'one of "none", "auto", "required".')
        choice["mode"] = mode
    tools = holder.get("tools")
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_ALLOWED:
        raise _bad(_at(where, "tools"), f"a list of 1 to {MAX_ALLOWED} tools.")
    choice["tools"] = [
        _named(
            _object(tool, _at(where, "tools", index), "a tool"), _at(where, "tools", index), dialect
        )
        for index, tool in enumerate(tools)
    ]
    return choice
