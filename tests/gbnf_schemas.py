"""Random JSON Schemas in the part of JSON Schema that :mod:`lmsp.constraints.gbnf`
writes as GBNF (hypothesis strategies), shared by its pure tests and the tests against a
real ``llama-server``."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

NAMES = st.text(string.ascii_letters + "_-é ", min_size=1, max_size=6)
SCALARS = st.one_of(
    st.text(max_size=5), st.integers(-50, 50), st.booleans(), st.none(), st.floats(-9, 9)
)


def _leaves() -> st.SearchStrategy[dict[str, Any]]:
    bounded = st.tuples(st.integers(0, 4), st.integers(0, 6)).map(
        lambda b: {"type": "string", "minLength": b[0], "maxLength": b[0] + b[1]}
    )
    return st.one_of(
        st.sampled_from(
            [
                {"type": "string"},
                {"type": "integer"},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "null"},
                {"type": ["string", "null"]},
                {"type": "object"},
                {},
            ]
        ),
        bounded,
        st.lists(SCALARS, min_size=1, max_size=4).map(lambda v: {"enum": v}),
        SCALARS.map(lambda v: {"const": v}),
    )


def _object(props: dict[str, Any], draw_required: list[bool]) -> dict[str, Any]:
    required = [name for name, needed in zip(props, draw_required, strict=False) if needed]
    return {"type": "object", "properties": props, "required": required}


def _nested(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.builds(
        _object,
        st.dictionaries(NAMES, inner, max_size=4),
        st.lists(st.booleans(), min_size=4, max_size=4),
    )
    arrays = st.builds(
        lambda items, low, extra: {
            "type": "array",
            "items": items,
            "minItems": low,
            **({} if extra is None else {"maxItems": low + extra}),
        },
        inner,
        st.integers(0, 2),
        st.one_of(st.none(), st.integers(0, 3)),
    )
    return st.one_of(
        objects,
        arrays,
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
        inner.map(lambda s: {"type": "object", "additionalProperties": s}),
    )


SCHEMAS = st.recursive(_leaves(), _nested, max_leaves=8)
