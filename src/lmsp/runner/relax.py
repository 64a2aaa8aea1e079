"""Schema keywords a grammar cannot enforce, in tools that are not ``strict`` (pure).

llguidance holds a call's arguments to its tool's JSON Schema while they are generated,
but some keywords it cannot enforce (``propertyNames``, ``patternProperties``,
``dependentSchemas``, ``if``/``then``/``else``, some string ``format``\\ s, …). Claude
Code's own tools use some of them. The rule (docs/tools.md, "Keywords a grammar cannot
enforce"):

- a ``strict`` tool (``strict: true``; the default on ``/v1/responses``, as at OpenAI)
  keeps the ``400 unsupported_schema`` naming the keyword: strict means every call
  matches the schema;
- a tool that is not strict (``strict: false``; the default on Chat Completions and
  Messages) has each such keyword, one at a time as llguidance names it, left out of
  the grammar (:func:`relax`: the tool keeps its ``parameters`` as given, the grammar
  uses its ``enforced_parameters``, and ``relaxed`` lists the keywords' paths); everything
  else stays enforced. Once generated, each call of such a tool is checked against its
  whole schema (:func:`check_calls`); a call that breaks it fails the response with
  ``tool_arguments_invalid`` naming the tool and the rule broken (it is not
  regenerated: its events were already streamed).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import msgspec

from lmsp.engines.base import EngineError
from lmsp.protocol.tools import FunctionTool

#: at most this many keywords are left out of one request's schemas
MAX_RELAXED = 16


def relax(tool: FunctionTool, path: str | None) -> FunctionTool | None:
    """``tool`` with the keyword at ``path`` (dotted, in the tool's enforced schema) left
    out of its grammar; ``None`` if it cannot be found (then the refusal stands)."""
    if not path or len(tool.relaxed or ()) >= MAX_RELAXED:
        return None
    enforced = copy.deepcopy(tool.enforced if tool.enforced is not None else tool.parameters or {})
    *parents, last = path.split(".")
    holder: Any = enforced
    for part in parents:
        if isinstance(holder, dict) and part in holder:
            holder = holder[part]
        elif isinstance(holder, list) and part.isdigit() and int(part) < len(holder):
            holder = holder[int(part)]
        else:
            return None
    if not isinstance(holder, dict) or last not in holder:
        return None
    del holder[last]
    return msgspec.structs.replace(tool, enforced=enforced, relaxed=(*(tool.relaxed or ()), path))


def check_calls(items: list[dict[str, Any]], tools: Sequence[FunctionTool]) -> None:
    """Check each function call of ``items`` whose tool had keywords relaxed against its
    whole schema; raise ``tool_arguments_invalid`` for the first that breaks it."""
    relaxed = {tool.name: tool for tool in tools if tool.relaxed}
    if not relaxed:
        return
    import jsonschema  # type: ignore[import-untyped]  # paid for only when needed

    for item in items:
        tool = relaxed.get(item.get("name", "")) if item.get("type") == "function_call" else None
        if tool is None:
            continue
        try:
            arguments = json.loads(item.get("arguments") or "{}")
        except ValueError:
            continue  # not the schema's business: the grammar keeps them JSON
        schema = tool.parameters or {}
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(str(part) for part in error.absolute_path) or "(the arguments)"
            raise EngineError(
                "tool_arguments_invalid",
                f"The call of {tool.name!r} breaks its schema at {where}: {error.message}"
                f" (a keyword the grammar cannot enforce: {', '.join(tool.relaxed or ())}).",
            )
