"""JSON Schemas as GBNF grammars, exactly or not at all (pure: no model needed).

A ``llama-server`` built without llguidance still holds its output to a GBNF grammar
with its own sampler, but its ``json_schema`` field is no use to lmsp: its converter
relaxes what it cannot express (an unknown keyword is dropped, a pattern it cannot
read matches any string). :func:`from_schema` writes the GBNF itself for the part of
JSON Schema that GBNF expresses exactly, and refuses the rest with an
:class:`~lmsp.constraints.grammar.UnsupportedSchema` naming the keyword and where it
sits: whatever such an upstream generates validates against the schema.

The grammar may be tighter than the schema, never looser: the JSON is laid out as the
local engine lays it out (compact, with ``", "`` and ``": "``), properties come in the
schema's order, no property the schema does not name is generated, and a number has
at most 16 digits before and after its point (a small model left unbounded can write
digits until its token budget runs out).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from typing import Any

from lmsp.constraints.grammar import JSON_OPTIONS, UnsupportedSchema

__all__ = ["from_llguidance", "from_schema"]

#: the largest count a length or item bound may name (llama.cpp expands repetitions)
MAX_REPEAT = 1000

#: keywords that say nothing about which values are valid
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "x-guidance",
    }
)
#: the keywords of each type (``type`` absent: the one type whose keywords appear)
TYPE_KEYWORDS = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength"}),
}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

#: the rules every grammar may use
BASE_RULES = {
    "value": 'object | array | string | number | "true" | "false" | "null"',
    "object": '"{" ( member ( ", " member )* )? "}"',
    "member": 'string ": " value',
    "array": '"[" ( value ( ", " value )* )? "]"',
    "string": '"\\"" char* "\\""',
    "char": '[^"\\\\\\x00-\\x1F] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "integer": '"-"? ( "0" | [1-9] [0-9]{0,15} )',
    "number": 'integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?',
    "boolean": '"true" | "false"',
    "null": '"null"',
}
#: which base rules each base rule needs
_NEEDS = {
    "value": ("object", "array", "string", "number"),
    "object": ("member",),
    "member": ("string", "value"),
    "array": ("value",),
    "string": ("char",),
    "number": ("integer",),
}


def from_llguidance(text: str) -> str:
    """The GBNF of a grammar :func:`lmsp.constraints.grammar.json_grammar` wrote (one
    JSON Schema); :class:`UnsupportedSchema` for any other grammar (tool calls)."""
    try:
        grammars = json.loads(text)["grammars"]
        (only,) = grammars
        (schema,) = only.values()
        assert set(only) == {"json_schema"}
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UnsupportedSchema("Only a JSON Schema can be held to a GBNF grammar.", None) from None
    return from_schema(schema)


def from_schema(schema: Any) -> str:
    """The GBNF grammar (its ``root`` one whole value) of ``schema``."""
    if isinstance(schema, dict):
        options = schema.get("x-guidance")
        if options is not None and options != JSON_OPTIONS:
            raise UnsupportedSchema("Only lmsp's own JSON layout can be enforced.", "x-guidance")
    return _Writer(schema).grammar()


class _Writer:
    """One schema's rules, each written once."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.defs: dict[str, Any] = {}
        if isinstance(root, dict):
            for key in ("$defs", "definitions"):
                found = root.get(key, {})
                if not isinstance(found, dict):
                    raise UnsupportedSchema(f"{key!r} must be an object.", key)
                self.defs.update({f"#/{key}/{name}": s for name, s in found.items()})
        self.rules: dict[str, str] = {}  # name → body
        self.named: dict[str, str] = {}  # body → name
        self.refs: dict[str, str] = {}  # $ref → rule name
        self.used: set[str] = set()

    def grammar(self) -> str:
        root = self.rule_of(self.root, "")
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        wanted = list(self.used)
        while wanted:
            name = wanted.pop()
            for need in _NEEDS.get(name, ()):
                if need not in self.used:
                    self.used.add(need)
                    wanted.append(need)
        lines += [f"{name} ::= {BASE_RULES[name]}" for name in BASE_RULES if name in self.used]
        return "\n".join(lines) + "\n"

    # -- rules -----------------------------------------------------------------------------
    def base(self, name: str) -> str:
        self.used.add(name)
        return name

    def name(self, body: str) -> str:
        """A rule of ``body`` (one per distinct body)."""
        if body in self.named:
            return self.named[body]
        name = f"r{len(self.rules)}"
        self.rules[name] = body
        self.named[body] = name
        return name

    def rule_of(self, schema: Any, path: str) -> str:
        """An expression (a rule name, or a literal) of the values ``schema`` admits."""
        if schema is True or schema == {}:
            return self.base("value")
        if not isinstance(schema, dict):
            raise UnsupportedSchema("A schema that admits no value cannot be generated.", path)
        if "$ref" in schema:
            return self.ref(schema, path)
        keys = set(schema) - ANNOTATIONS - {"$defs", "definitions"}
        for combiner in ("anyOf", "allOf", "oneOf", "not", "if"):
            if combiner in keys:
                return self.combined(schema, combiner, keys, path)
        if "enum" in keys or "const" in keys:
            return self.literals(schema, path)
        types = self.types(schema, keys, path)
        parts = [self.typed(schema, t, keys, path) for t in types]
        return parts[0] if len(parts) == 1 else self.name(" | ".join(parts))

    def ref(self, schema: dict[str, Any], path: str) -> str:
        if set(schema) - ANNOTATIONS - {"$defs", "definitions"} != {"$ref"}:
            raise UnsupportedSchema("A $ref beside other keywords cannot be enforced.", path)
        target = schema["$ref"]
        if target in self.refs:
            return self.refs[target]
        if target == "#":
            found: Any = self.root
        elif target in self.defs:
            found = self.defs[target]
        else:
            raise UnsupportedSchema(f"The $ref {target!r} cannot be followed.", _at(path, "$ref"))
        name = f"d{len(self.refs)}"
        self.refs[target] = name
        self.rules[name] = ""  # reserved: a recursive reference finds it
        self.rules[name] = self.rule_of(found, _at(path, "$ref"))
        return name

    def combined(self, schema: dict[str, Any], combiner: str, keys: set[str], path: str) -> str:
        where = _at(path, combiner)
        if combiner != "anyOf" or keys != {"anyOf"}:
            raise UnsupportedSchema(f"The schema keyword {combiner!r} cannot be enforced.", where)
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise UnsupportedSchema("'anyOf' must be a list of schemas.", where)
        parts = [self.rule_of(s, _at(where, str(i))) for i, s in enumerate(options)]
        return self.name(" | ".join(parts))

    def literals(self, schema: dict[str, Any], path: str) -> str:
        """An ``enum`` or ``const``: the values that also meet the schema's other keywords."""
        import jsonschema  # type: ignore[import-untyped]

        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list):
            raise UnsupportedSchema("'enum' must be a list.", _at(path, "enum"))
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        rest.pop("x-guidance", None)
        try:
            check = jsonschema.Draft202012Validator(rest)
            kept = [v for v in values if check.is_valid(v)]
        except jsonschema.exceptions.SchemaError as exc:
            raise UnsupportedSchema(f"The schema is not valid: {exc.message}", path) from None
        if not kept:
            raise UnsupportedSchema("No value of the enum meets the schema.", path)
        return self.name(" | ".join(_literal(_dumps(v)) for v in _unique(kept)))

    def types(self, schema: dict[str, Any], keys: set[str], path: str) -> list[str]:
        given = schema.get("type")
        if given is None:
            found = [t for t, words in TYPE_KEYWORDS.items() if keys & words]
            if len(found) > 1:
                raise UnsupportedSchema(
                    "A schema with the keywords of several types needs a 'type'.", path
                )
            return found or ["any"]
        types = given if isinstance(given, list) else [given]
        if not types or any(t not in TYPES for t in types):
            raise UnsupportedSchema(
                f"The type {given!r} is not a JSON Schema type.", _at(path, "type")
            )
        return list(dict.fromkeys(types))

    def typed(self, schema: dict[str, Any], kind: str, keys: set[str], path: str) -> str:
        """The values of one type that meet the schema's keywords."""
        allowed = TYPE_KEYWORDS.get(kind, frozenset()) | {"type"}
        stray = sorted(keys - allowed - set().union(*TYPE_KEYWORDS.values()) - _no_op(schema))
        if stray:
            key = stray[0]
            raise UnsupportedSchema(
                f"The schema keyword {key!r} cannot be enforced.", _at(path, key)
            )
        if kind == "object":
            return self.object(schema, path)
        if kind == "array":
            return self.array(schema, path)
        if kind == "string":
            return self.string(schema, path)
        return self.base("value" if kind == "any" else kind)

    def object(self, schema: dict[str, Any], path: str) -> str:
        properties = schema.get("properties")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise UnsupportedSchema("'required' must be a list of names.", _at(path, "required"))
        missing = [r for r in required if r not in (properties or {})]
        if missing:
            raise UnsupportedSchema(
                f"'required' names {missing[0]!r}, which 'properties' does not describe.",
                _at(path, "required"),
            )
        if properties is None:  # any names: only additionalProperties holds their values
            return self.open_object(schema.get("additionalProperties", True), path)
        if not isinstance(properties, dict):
            raise UnsupportedSchema("'properties' must be an object.", _at(path, "properties"))
        where = _at(path, "properties")
        members = [
            (_literal(_dumps(key) + ": ") + " " + self.rule_of(s, _at(where, key)), key in required)
            for key, s in properties.items()
        ]
        return self.name('"{" ' + self.members(members) + ' "}"')

    def open_object(self, extra: Any, path: str) -> str:
        """An object of any names whose values are ``extra``'s."""
        if extra is False:
            return self.name('"{}"')
        if extra is True or extra == {}:
            return self.base("object")
        value = self.rule_of(extra, _at(path, "additionalProperties"))
        member = self.name(f'{self.base("string")} ": " {value}')
        return self.name(f'"{{" ( {member} ( ", " {member} )* )? "}}"')

    def members(self, members: Sequence[tuple[str, bool]]) -> str:
        """Members in order, each required one present, joined by ``", "``: two rules per
        place, one before any member was written, one after (then a separator leads)."""
        first, after = "", ""  # past the last place: nothing more
        for member, needed in reversed(members):
            alone = self.name(f"{member}{_then(after)}")
            lead = self.name(f'", " {member}{_then(after)}')
            if needed:
                first, after = alone, lead
            else:
                first = self.name(f"{alone} | {first}" if first else f"( {alone} )?")
                after = self.name(f"{lead} | {after}" if after else f"( {lead} )?")
        return first

    def array(self, schema: dict[str, Any], path: str) -> str:
        items = self.rule_of(schema.get("items", True), _at(path, "items"))
        low, high = _bounds(schema, "minItems", "maxItems", path)
        if high == 0:
            return self.name('"[]"')
        rest = _repeat(f'( ", " {items} )', max(low - 1, 0), None if high is None else high - 1)
        body = f"{items} {rest}".strip()
        return self.name(f'"[" {body} "]"' if low else f'"[" ( {body} )? "]"')

    def string(self, schema: dict[str, Any], path: str) -> str:
        low, high = _bounds(schema, "minLength", "maxLength", path)
        if low == 0 and high is None:
            return self.base("string")
        char = self.base("char")
        return self.name(f'"\\"" {_repeat(f"( {char} )", low, high)} "\\""')


def _no_op(schema: dict[str, Any]) -> set[str]:
    """Keywords whose value here asks for nothing (``uniqueItems: false``)."""
    return {"uniqueItems"} if schema.get("uniqueItems") is False else set()


def _bounds(schema: dict[str, Any], least: str, most: str, path: str) -> tuple[int, int | None]:
    """The bounds a pair of keywords sets (``minItems``, ``maxItems``): at least 0, at
    most ``None`` (no bound) when absent."""
    found: list[int | None] = []
    for key in (least, most):
        value = schema.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise UnsupportedSchema(f"{key!r} must be a whole number.", _at(path, key))
        if value is not None and value > MAX_REPEAT:
            raise UnsupportedSchema(
                f"{key!r} over {MAX_REPEAT} cannot be enforced on this upstream.", _at(path, key)
            )
        found.append(value)
    low, high = found
    if high is not None and low is not None and high < low:
        raise UnsupportedSchema(f"{least!r} over {most!r} admits no value.", _at(path, least))
    return low or 0, high


def _repeat(part: str, low: int, high: int | None) -> str:
    """``part`` repeated ``low`` to ``high`` (``None``: any number) times."""
    if high is None:
        return f"{part}{{{low},}}" if low else f"{part}*"
    if high == 0:
        return ""
    return f"{part}{{{low},{high}}}" if low != high else f"{part}{{{low}}}"


def _then(rest: str) -> str:
    return f" {rest}" if rest else ""


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _dumps(value: Any) -> str:
    """A JSON value laid out as the local engine writes it; a character no model's
    vocabulary can be trusted to hold (unassigned, private, a lone surrogate) is
    written as its ``\\u`` escape, the same value in JSON (llama-server fails the
    request on an unassigned one)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return "".join(_escaped(ch) if unicodedata.category(ch) in _RARE else ch for ch in text)


_RARE = frozenset({"Cn", "Co", "Cs"})


def _escaped(ch: str) -> str:
    return json.dumps(ch)[1:-1]  # ensure_ascii: surrogate pairs past the BMP


def _unique(values: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for value in values:
        seen.setdefault(json.dumps(value, sort_keys=True), value)
    return list(seen.values())


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
