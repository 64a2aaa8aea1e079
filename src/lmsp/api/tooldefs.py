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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.protocol import mcp

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


RESPONSES = Dialect(wrapper="", allowed="")
CHAT = Dialect(wrapper="function", allowed="allowed_tools")


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
    return tool


def read_tools(value: Any, dialect: Dialect) -> list[dict[str, Any]]:
    """``tools`` (a list, or ``None``) in the Responses form."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad("tools", "a list of tools.")
    out = []
    for index, item in enumerate(value):
        where = _at("tools", index)
        given = _object(item, where, "a tool")
        kind = _type(given, where)
        if kind == mcp.MCP and dialect is RESPONSES:  # an MCP server (protocol/mcp.py)
            out.append(mcp.read_tool(given, where))
            continue
        out.append(_function(given, where, dialect) if kind == "function" else {"type": kind})
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
