"""The policy for tools and structured output, shared by both APIs (pure).

Both APIs check the request in its Responses form (a chat completion's ``tools``,
``tool_choice`` and ``response_format`` are translated first), with ``param`` names
given in the caller's own terms. Every schema is compiled here, before anything is
written: a keyword llguidance cannot enforce is a ``400 unsupported_schema`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lmsp.constraints import grammar
from lmsp.errors import LmspError

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
        grammar.check_schema(schema)
    except grammar.UnsupportedSchema as exc:
        param = f"{where}.{exc.path}" if exc.path else where
        yield LmspError("unsupported_schema", f"{what}: {exc.message}", param=param)


def problems(
    tools: list[dict[str, Any]],
    choice: Any,
    fmt: dict[str, Any] | None,
    stop: Any,
    param: Param = responses_param,
) -> Iterator[LmspError]:
    """Every refusal of the tools, ``tool_choice`` and text format of a request."""
    names: set[str] = set()
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            yield LmspError(
                "unsupported_parameter",
                f"Tool type {kind!r} is not supported here; only function tools are.",
                param=param("tools", index, "type"),
            )
            continue
        name = tool.get("name")
        if not name:
            yield LmspError(
                "invalid_value",
                "A function tool needs a name.",
                param=param("tools", index, "name"),
            )
            continue
        if name in names:
            yield LmspError(
                "invalid_value",
                f"Two tools are named {name!r}.",
                param=param("tools", index, "name"),
            )
        names.add(name)
        parameters = tool.get("parameters")
        if parameters is not None:
            where = param("tools", index, "parameters")
            if isinstance(parameters, dict) and parameters.get("type", "object") != "object":
                yield LmspError(
                    "unsupported_schema",
                    "A function's parameters must be an object schema.",
                    param=f"{where}.type",
                )
            else:
                yield from _schema(parameters, where, f"The parameters of {name!r}")
    yield from _choice(choice, names, param)
    calls = bool(names) and choice != "none"
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
