"""JSON schemas on a remote model whose upstream runs GBNF grammars, not llguidance (a
stock ``llama-server``), against the real upstream: what lmsp writes as GBNF
(:mod:`lmsp.constraints.gbnf`) holds every answer to its schema — schemas drawn at
random and sampled at temperature 1, directly and through a real ``lmsp serve`` — and
what GBNF cannot hold exactly (a ``pattern``, ``oneOf``, tools) is ``400`` at create
and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmsp.constraints import gbnf
from tests import remote_fixtures
from tests.gbnf_schemas import SCHEMAS
from tests.helpers import Server, open_db
from tests.remote_fixtures import MODEL, add, final, output_text
from tests.upstream import Upstream

lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream

pytestmark = pytest.mark.slow

PROMPT = "Write a JSON value about a cat:\n"


@pytest.fixture(scope="module")
def shared_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    started = Upstream(tmp_path_factory.mktemp("gbnf") / "llama-server.log").start()
    try:
        yield started
    finally:
        started.stop()


def _generate(up: Upstream, grammar: str, seed: int) -> tuple[str, str]:
    body = {"prompt": PROMPT, "n_predict": 160, "temperature": 1.0, "seed": seed}
    answer = httpx.post(f"{up.url}/completion", json={**body, "grammar": grammar}, timeout=300)
    assert answer.status_code == 200, (answer.text, grammar)
    data = answer.json()
    return str(data["content"]), str(data.get("stop_type"))


def test_every_answer_of_the_upstream_held_to_a_written_grammar_validates(
    shared_upstream: Upstream,
) -> None:
    """Random schemas, each answer sampled at temperature 1: an answer that ends on its
    own (not cut at the token limit) is one JSON value that meets its schema."""
    ended: list[str] = []

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(schema=SCHEMAS, seed=st.integers(0, 2**16))
    def check(schema: dict[str, Any], seed: int) -> None:
        grammar = gbnf.from_schema(schema)
        text, stop = _generate(shared_upstream, grammar, seed)
        if stop == "limit":
            return  # cut mid-value: incomplete, as a local engine's would be
        assert stop == "eos", (stop, text)
        jsonschema.validate(json.loads(text), schema)
        ended.append(text)

    check()
    print(f"{len(ended)} of 40 answers ended on their own and validated")
    assert len(ended) >= 10


# -- through lmsp ----------------------------------------------------------------------------
SERVED: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "colours": {"type": "array", "items": {"enum": ["black", "white", "ginger"]}},
            "indoor": {"type": "boolean"},
        },
        "required": ["name", "indoor"],
        "additionalProperties": False,
    },
    {
        "$defs": {
            "toy": {
                "type": "object",
                "properties": {"kind": {"type": "string"}, "inside": {"$ref": "#/$defs/toy"}},
                "required": ["kind"],
            }
        },
        "type": "object",
        "properties": {"toys": {"type": "array", "items": {"$ref": "#/$defs/toy"}, "maxItems": 3}},
        "required": ["toys"],
    },
    {"type": "array", "items": {"type": ["number", "null"]}, "minItems": 1, "maxItems": 4},
]


def _respond(http: httpx.Client, fmt: dict[str, Any], seed: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "input": "Describe a cat as JSON.",
        "background": True,
        "temperature": 1.0,
        "seed": seed,
        "max_output_tokens": 200,
        "text": {"format": fmt},
    }
    created = http.post("/v1/responses", json=body)
    assert created.status_code in (200, 202), created.text
    return final(http, created.json()["id"])


def test_a_json_schema_on_a_gbnf_upstream_is_met_by_every_answer(
    lmsp: Server, upstream: Upstream
) -> None:
    ended = 0
    with lmsp.client(timeout=300) as http:
        caps = add(http, upstream)["remote"]["capabilities"]
        assert caps["gbnf"] is True and caps["grammar"] is False
        formats = [
            {"type": "json_schema", "name": f"s{i}", "schema": s} for i, s in enumerate(SERVED)
        ]
        for fmt in [*formats, {"type": "json_object"}]:
            schema = fmt.get("schema", {"type": "object"})
            for seed in range(3):
                done = _respond(http, fmt, seed)
                if done["status"] == "incomplete":
                    assert done["incomplete_details"]["reason"] == "max_output_tokens"
                    continue
                assert done["status"] == "completed", done
                jsonschema.validate(json.loads(output_text(done)), schema)
                ended += 1
    assert ended >= 6  # of 12


def test_what_gbnf_cannot_hold_exactly_is_refused_and_writes_nothing(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        add(http, upstream)
        conn = open_db(lmsp.data_dir)
        before = conn.execute("SELECT count(*) FROM responses").fetchone()[0]
        conn.close()

        def create(schema: dict[str, Any]) -> httpx.Response:
            fmt = {"type": "json_schema", "name": "x", "schema": schema}
            body = {"model": MODEL, "input": "hi", "background": True, "text": {"format": fmt}}
            return http.post("/v1/responses", json=body)

        pattern = create(
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}
        )
        one_of = create({"oneOf": [{"type": "string"}, {"type": "integer"}]})
        bounded = create({"type": "integer", "minimum": 3})
        tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
        tools = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [tool]})
        chat_format = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}},
        }
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": chat_format,
            },
        )
    for refused, param in [
        (pattern, "text.format.schema.properties.a.pattern"),
        (one_of, "text.format.schema.oneOf"),
        (bounded, "text.format.schema.minimum"),
        (chat, "response_format.json_schema.schema.format"),
    ]:
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unsupported_schema" and error["param"] == param, error
        assert "GBNF" in error["message"]
    assert tools.status_code == 400, tools.text
    assert tools.json()["error"]["param"] == "tools" and "tools" in tools.json()["error"]["message"]
    conn = open_db(lmsp.data_dir)
    try:
        assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] == before
    finally:
        conn.close()
