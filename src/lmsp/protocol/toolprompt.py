"""How tool definitions reach a model whose chat template has no place for them.

A template that renders ``tools`` (Qwen, Llama 3.1, Hermes …) gets them as the
template expects, ``[{"type": "function", "function": {name, description,
parameters}}]``. A template that does not (SmolLM2's) gets this generic format instead,
appended to the system message (or as a system message of its own, first)::

    # Tools

    You may call one or more functions to help with the user's request.
    The functions, one JSON object a line:
    <tools>
    {"name": "get_weather", "description": "...", "parameters": {...}}
    </tools>

    To call a function, write exactly:
    <tool_call>{"name": "<function name>", "arguments": <the arguments as JSON>}</tool_call>

The call format is the one the constrained decoder enforces
(:mod:`lmsp.constraints.grammar`) and the one past calls are rendered in.
"""

from __future__ import annotations

import json
from typing import Any

HEADER = (
    "# Tools\n\nYou may call one or more functions to help with the user's request.\n"
    "The functions, one JSON object a line:\n<tools>\n"
)
FOOTER = (
    "</tools>\n\nTo call a function, write exactly:\n"
    '<tool_call>{"name": "<function name>", "arguments": <the arguments as JSON>}'
    "</tool_call>"
)


def describe(tool: dict[str, Any]) -> dict[str, Any]:
    """One function as the model is shown it."""
    shown: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description"):
        shown["description"] = tool["description"]
    shown["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return shown


def tools_text(tools: list[dict[str, Any]]) -> str:
    lines = "".join(json.dumps(describe(tool), ensure_ascii=False) + "\n" for tool in tools)
    return HEADER + lines + FOOTER


def template_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as chat templates take them."""
    return [{"type": "function", "function": describe(tool)} for tool in tools]


def supports_tools(template: str) -> bool:
    """Does a chat template render ``tools``?"""
    return "tools" in template


def with_tools(messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``messages`` with the generic tool description in the system message."""
    if not tools:
        return messages
    text = tools_text(tools)
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": messages[0]["content"] + "\n\n" + text}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
