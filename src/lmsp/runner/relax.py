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
  uses :data:`ENFORCED`, and :data:`RELAXED` lists the keywords' paths); everything
  else stays enforced. Once generated, each call of such a tool is checked against its
  whole schema (:func:`check_calls`); a call that breaks it fails the response with
  ``tool_arguments_invalid`` naming the tool and the rule broken (it is not
  regenerated: its events were already streamed).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from lmsp.engines.base import EngineError

#: the schema the grammar enforces, when some keywords were left out of it
ENFORCED = "enforced_parameters"
#: the dotted paths (in ``parameters``) of the keywords left out
RELAXED = "relaxed"
#: at most this many keywords are left out of one request's schemas
MAX_RELAXED = 16


def relax(tool: dict[str, Any], path: str | None) -> bool:
    """Leave the keyword at ``path`` (dotted, in the tool's enforced schema) out of the
    grammar of ``tool``; ``False`` if it cannot be found (then the refusal stands)."""
    if not path or len(tool.get(RELAXED) or []) >= MAX_RELAXED:
        return False
    enforced = tool.get(ENFORCED)
    if enforced is None:
        enforced = copy.deepcopy(tool.get("parameters") or {})
    *parents, last = path.split(".")
    holder: Any = enforced
    for part in parents:
        if isinstance(holder, dict) and part in holder:
            holder = holder[part]
        elif isinstance(holder, list) and part.isdigit() and int(part) < len(holder):
            holder = holder[int(part)]
        else:
            return False
    if not isinstance(holder, dict) or last not in holder:
        return False
    del holder[last]
    tool[ENFORCED] = enforced
    tool[RELAXED] = [*(tool.get(RELAXED) or []), path]
    return True


def check_calls(items: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """Check each function call of ``items`` whose tool had keywords relaxed against its
    whole schema; raise ``tool_arguments_invalid`` for the first that breaks it."""
    relaxed = {tool["name"]: tool for tool in tools if tool.get(RELAXED)}
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
        validator = jsonschema.validators.validator_for(tool["parameters"])(tool["parameters"])
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(str(part) for part in error.absolute_path) or "(the arguments)"
            raise EngineError(
                "tool_arguments_invalid",
                f"The call of {tool['name']!r} breaks its schema at {where}: {error.message}"
                f" (a keyword the grammar cannot enforce: {', '.join(tool[RELAXED])}).",
            )
