"""The grammar budget: a request's schemas and grammar compiled once in a worker, a
grammar over the CPU or size budget refused (never compiled on the caller's thread),
outcomes cached by the grammar's text, and llguidance's internals kept out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from lmsp import sandbox
from lmsp.constraints import grammar
from lmsp.constraints.budget import GrammarBudget, Outcome, compile_job, looks_internal
from lmsp.sandbox import Sandbox
from tests.hostile import schema_bomb

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[GrammarBudget]:
    monkeypatch.setattr(sandbox, "WALL_FACTOR", 60.0)  # the CPU budget stops it, busy or not
    box = Sandbox(1, memory_bytes=1 << 30)
    yield GrammarBudget(box, cpu_seconds=0.5, max_bytes=1 << 20)
    box.close()


def check(budget: GrammarBudget, schemas: list[dict[str, Any]], text: bool = True) -> Outcome:
    text_grammar = grammar.json_grammar(schemas[-1]) if text else None
    return asyncio.run(budget.check(text_grammar, schemas))


def test_the_job_compiles_and_names_the_schema_at_fault() -> None:
    assert compile_job(grammar.json_grammar(SCHEMA), json.dumps([SCHEMA])) == ("ok", None, "")
    bad = {"type": "array", "uniqueItems": True}
    kind, index, problem = compile_job(grammar.json_grammar(SCHEMA), json.dumps([SCHEMA, bad]))
    assert (kind, index) == ("unsupported", 1)
    assert grammar.unsupported(bad, problem).path == "uniqueItems"


def test_a_schema_within_budget_passes_and_is_compiled_once(budget: GrammarBudget) -> None:
    assert check(budget, [SCHEMA]).ok
    assert check(budget, [dict(SCHEMA)]).ok
    assert budget.compiles == 1


def test_a_schema_bomb_goes_past_the_cpu_budget_once(budget: GrammarBudget) -> None:
    bomb = schema_bomb(9_000)
    outcome = check(budget, [bomb])
    assert (outcome.kind, outcome.limit) == ("too_complex", "cpu")
    again = check(budget, [bomb])
    assert again == outcome and budget.compiles == 1  # the cache answered
    assert budget.sandbox.overruns == {"cpu": 1}


def test_schemas_over_the_size_budget_are_refused_before_any_work() -> None:
    box = Sandbox(1)
    try:
        small = GrammarBudget(box, cpu_seconds=5, max_bytes=10_000)
        outcome = check(small, [schema_bomb(1_000)])
        assert (outcome.kind, outcome.limit) == ("too_complex", "bytes")
        assert small.compiles == 0 and box.pids() == []  # no worker was even started
    finally:
        box.close()


def test_concurrent_checks_of_one_grammar_share_one_compile(budget: GrammarBudget) -> None:
    async def main() -> list[Outcome]:
        return list(
            await asyncio.gather(
                *(budget.check(grammar.json_grammar(SCHEMA), [SCHEMA]) for _ in range(5))
            )
        )

    assert all(outcome.ok for outcome in asyncio.run(main()))
    assert budget.compiles == 1


def test_internals_are_recognised() -> None:
    panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>"
    assert looks_internal(panic)
    assert looks_internal("at /rustc/abc/library/core/src/panicking.rs:221:5")
    assert not looks_internal('Unimplemented keys: ["uniqueItems"]')
