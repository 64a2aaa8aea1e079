"""Recursive ``$ref``\\ s no instance can end, found before anything is written.

A schema whose ``$ref`` leads back to itself along required members only (``{"required":
["next"], "properties": {"next": {"$ref": "#"}}}``: every node must hold another) has no
finite instance: it passed the compile check, and then the model could only write until
its output limit ran out. It is refused when the request is created instead:
:func:`endless_ref` finds the first ``$ref`` that reaches itself again through members an
instance must have (a required property, an array's items when ``minItems`` is at least
one, every branch of ``allOf``, a lone ``anyOf``/``oneOf`` branch). A recursion an
instance can stop (an optional property, an array that may be empty, a tree) is fine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

#: keywords whose schema every instance must satisfy as well (no way around them)
_ALWAYS = frozenset({"allOf"})
_CHOICES = frozenset({"anyOf", "oneOf"})


def _resolve(root: Any, pointer: str) -> Any:
    """The value a local reference (``#``, ``#/$defs/node``) names; ``None`` if none."""
    if pointer in ("#", ""):
        return root
    if not pointer.startswith("#/"):
        return None
    node = root
    for raw in pointer[2:].split("/"):
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _members(node: dict[str, Any]) -> Iterator[tuple[str, Any, bool]]:
    """``(key path, sub-schema, must an instance have it)`` of a schema's children."""
    required = node.get("required")
    needed = set(required) if isinstance(required, list) else set()
    least = node.get("minItems")
    least = least if isinstance(least, int) else 0
    for key, value in node.items():
        if key == "$ref":
            continue
        if key == "properties" and isinstance(value, dict):
            for name, inner in value.items():
                yield f"properties.{name}", inner, name in needed
        elif key == "items" and isinstance(value, dict):
            yield "items", value, least >= 1
        elif key == "prefixItems" and isinstance(value, list):
            for index, inner in enumerate(value):
                yield f"prefixItems.{index}", inner, least > index
        elif key in _ALWAYS and isinstance(value, list):
            for index, inner in enumerate(value):
                yield f"{key}.{index}", inner, True
        elif key in _CHOICES and isinstance(value, list):
            for index, inner in enumerate(value):
                yield f"{key}.{index}", inner, len(value) == 1
        elif isinstance(value, (dict, list)):
            yield key, value, False  # $defs, additionalProperties, not, …: not forced


def endless_ref(schema: Any) -> str | None:
    """The dotted path (inside ``schema``) of the first ``$ref`` that leads back to
    itself through members every instance must have; ``None`` when there is none."""
    explored: set[str] = set()

    def walk(node: Any, path: str, stack: tuple[str, ...], firm: int) -> str | None:
        # ``stack``: the references being expanded; those from ``firm`` on were entered
        # through forced members only (a loop back to one of them cannot be stopped)
        if isinstance(node, list):
            for index, value in enumerate(node):
                found = walk(value, f"{path}.{index}" if path else str(index), stack, firm)
                if found is not None:
                    return found
            return None
        if not isinstance(node, dict):
            return None
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            here = f"{path}.$ref" if path else "$ref"
            if ref in stack:
                if stack.index(ref) >= firm:
                    return here
            elif ref not in explored:
                target = _resolve(schema, ref)
                if target is not None and walk(target, path, (*stack, ref), firm) is not None:
                    return here
                explored.add(ref)
        for key, value, forced in _members(node):
            inner = f"{path}.{key}" if path else key
            found = walk(value, inner, stack, firm if forced else len(stack))
            if found is not None:
                return found
        return None

    return walk(schema, "", ("#",), 0)
