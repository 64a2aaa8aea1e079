"""JSON Schemas and tool calls as llguidance grammars (pure: no model needed).

Building a grammar's text is cheap (llguidance wraps the schema; nothing is compiled
yet): :func:`json_grammar` and :func:`calls_grammar` do only that, so the runner can
rebuild a task's grammar from its stored request at no cost. Compiling one is not
(super-linear in the schema's size): the API checks every request's grammar once,
under a time and size budget, in a worker process (:mod:`lmsp.constraints.budget`),
before anything is written; the engine then compiles it knowing it fits.

:func:`check_schema` validates one schema (``validate_grammar``) and is cached by the
schema's canonical JSON; a keyword llguidance cannot enforce is an
:class:`UnsupportedSchema` naming the keyword and where it sits, never a silent
relaxation (llguidance's ``lenient`` stays off).

JSON is generated compact, with the separators ``json.dumps`` writes (``", "`` and
``": "``) and no other whitespace: small models follow it best, and a model cannot pad
its output with whitespace until the token budget runs out.

A tool call is written as ``<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>``
(the Hermes/Qwen convention, which the input side renders for past calls too).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp.protocol.toolcalls import CALL_CLOSE, CALL_OPEN

#: how llguidance writes JSON here (``x-guidance`` options of each compiled schema)
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
#: ``{"type": "json_object"}``: any JSON object
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class UnsupportedSchema(ValueError):
    """A schema llguidance cannot enforce: ``path`` (dotted, inside the schema) names the
    keyword at fault when it can be found."""

    def __init__(self, message: str, path: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def digest(value: Any) -> str:
    """The digest of a JSON value's canonical form."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_options(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with lmsp's JSON layout options (``x-guidance``) set."""
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


def check_schema(schema: dict[str, Any]) -> str:
    """The grammar of ``schema``, validated (:class:`UnsupportedSchema` if llguidance
    cannot enforce it). Costs what compiling costs: call it where a budget holds (a
    worker of :mod:`lmsp.constraints.budget`)."""
    return _schema_grammar(json.dumps(schema))  # property order matters: it is kept


@functools.lru_cache(maxsize=64)
def _schema_grammar(canonical: str) -> str:
    from llguidance import LLMatcher  # here: a start serves before it needs llguidance

    schema = json.loads(canonical)
    grammar = schema_grammar(schema)
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise unsupported(schema, problem)
    return grammar


def schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar text of ``schema``, not validated (cheap: nothing is compiled)."""
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_json_schema(with_options(schema))
    except ValueError as exc:
        raise UnsupportedSchema(f"The schema is not valid: {_first_line(str(exc))}", None) from exc


def _first_line(text: str) -> str:
    """The first line of a library's message, without what follows (a backtrace)."""
    line = text.strip().splitlines()[0] if text.strip() else text
    return line[:300]


_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(?P<keys>[^\]]*)\]")
_FORMAT = re.compile(r"Unknown format: (?P<format>\S+)")


def unsupported(schema: dict[str, Any], problem: str) -> UnsupportedSchema:
    """The error for llguidance's ``problem``, with the path of the keyword at fault."""
    first = _first_line(problem)
    found = _UNIMPLEMENTED.search(problem)
    if found:
        keys = [k.strip().strip('"') for k in found["keys"].split(",") if k.strip()]
        for key in keys:
            path = next(_paths_of(schema, lambda k, _v, key=key: k == key), None)
            if path is not None:
                return UnsupportedSchema(f"The schema keyword {key!r} cannot be enforced.", path)
        return UnsupportedSchema(f"The schema keywords {keys} cannot be enforced.", None)
    found = _FORMAT.search(problem)
    if found:
        name = found["format"].strip("\"'")
        path = next(_paths_of(schema, lambda k, v: k == "format" and v == name), None)
        return UnsupportedSchema(f"The string format {name!r} cannot be enforced.", path)
    return UnsupportedSchema(f"The schema cannot be enforced: {first}", None)


def _paths_of(value: Any, match: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the keys (``match(key, value)``) anywhere in a schema."""
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if match(key, inner):
                yield path
            yield from _paths_of(inner, match, path)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths_of(inner, match, f"{prefix}.{index}" if prefix else str(index))


# -- grammars ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    """A function tool the model may call: its name and its arguments' schema."""

    name: str
    parameters: dict[str, Any]


def json_grammar(schema: dict[str, Any]) -> str:
    """The grammar of an output that is one JSON value matching ``schema`` (its text,
    not compiled)."""
    return schema_grammar(schema)


def _lark_json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(with_options(schema))


def _call_rules(functions: Sequence[Function]) -> str:
    """``call``: one whole call of one of ``functions``, ``<tool_call>`` left out."""
    names = " | ".join(f"call_{i}" for i in range(len(functions)))
    rules = [f"call: {names}"]
    for index, function in enumerate(functions):
        head = json.dumps('{"name": ' + json.dumps(function.name) + ', "arguments": ')
        tail = json.dumps("}" + CALL_CLOSE)
        rules.append(f"call_{index}: {head} args_{index} {tail}")
        rules.append(f"args_{index}: {_lark_json(function.parameters)}")
    return "\n".join(rules)


def calls_grammar(
    functions: Sequence[Function],
    *,
    required: bool,
    limit: int | None,
    text_schema: dict[str, Any] | None = None,
) -> str:
    """The grammar of an output with function calls.

    ``required``: the output is one to ``limit`` calls (one a line) and nothing else.
    Otherwise (``auto``) the model writes text and may start a call at any point by
    writing ``<tool_call>``; from there the call is constrained. After ``limit`` calls
    the output ends. With ``text_schema`` the output is either that JSON or calls.
    Its text only: nothing is compiled (see the module docstring).
    """
    if not functions:
        raise ValueError("no function to call")
    rules = [_call_rules(functions), "TEXT: /(.|\\n)*/"]
    whole = f"{json.dumps(CALL_OPEN)} call"
    # the calls after the first
    more = (
        "" if limit == 1 else f'("\\n" {whole})' + ("*" if limit is None else f"{{0,{limit - 1}}}")
    )
    if required:
        rules.insert(0, f"start: {whole} {more}")
    elif text_schema is not None:
        rules.insert(0, f"start: text_json | {whole} {more}")
        rules.append(f"text_json: {_lark_json(text_schema)}")
    else:
        rules.append(f"head[lazy]: TEXT {json.dumps(CALL_OPEN)}")
        rules.append("seg: head call")
        if limit is None:
            rules.insert(0, "start: seg* TEXT")
        elif limit == 1:
            rules.insert(0, "start: TEXT | seg")
        else:
            rules.insert(0, f"start: seg{{0,{limit - 1}}} end\nend: TEXT | seg")
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_lark("\n".join(rules))
    except ValueError as exc:
        message = f"The tools cannot be enforced: {_first_line(str(exc))}"
        raise UnsupportedSchema(message, None) from None
