"""A body that fails its schema (pydantic's errors) as the one ``400`` the API answers:
the field the client got wrong, named as the API names fields (``input.2.content``).
Shared by the HTTP routes (FastAPI's validation errors) and the WebSocket's
``response.create`` frames."""

from __future__ import annotations

import re
from typing import Any

from lmsp import errors


def _param(loc: tuple[Any, ...]) -> str | None:
    # the first element names where the value was (body, query …); a field may be "path"
    located = bool(loc) and loc[0] in ("body", "query", "path", "header")
    parts = [str(p) for p in (loc[1:] if located else loc)]
    # pydantic names union branches ("str", "list[InputMessage]", "ToolChoiceObject"):
    # keep field names (snake_case) and list indexes
    clean = [p for p in parts if p not in _UNION_TAGS and not _TAG.search(p)]
    return ".".join(clean) or None


_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
_TAG = re.compile(r"[\[\](]|^[A-Z]|^constrained-")


def _weight(problem: dict[str, Any]) -> tuple[int, bool]:
    kind = str(problem.get("type", ""))
    return len(problem.get("loc", ())), not (kind.endswith("_type") or kind == "is_instance_of")


def validation_problem(problems: list[dict[str, Any]]) -> errors.LmspError:
    """The ``400`` a body that fails its schema gets (pydantic's ``errors()``): the field
    the client got wrong, named as the API names fields."""
    if any(p.get("type") == "json_invalid" for p in problems):
        return errors.invalid("The body is not valid JSON.", code="invalid_json")
    # in a union, the deepest error names the field the client got wrong; at one depth,
    # a broken limit ("at most 4 items") before another branch's type ("a valid string")
    first = max(problems, key=_weight, default={})
    loc = tuple(first.get("loc", ()))
    param = _param(loc)
    if first.get("type") == "missing" and param is None:
        return errors.invalid("A JSON body is required.", code="invalid_json")
    message = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
    return errors.invalid(message, param=param, code="invalid_value")
