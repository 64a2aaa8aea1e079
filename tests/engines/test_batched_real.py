"""The batched engine session on the real model (llama.cpp, the bundled GGUF).

Sequences stepped together must give exactly the tokens each gives alone; a sequence
that is cancelled, finishes or is constrained must not disturb the others; a prompt
that starts from a cached prefix — a finished sequence's, or one saved on disk before
a restart — must give exactly what a cold evaluation gives; and a saved
prefix of another model or another prompt, or a damaged file, is never used.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.constraints import grammar
from lmsp.constraints.matcher import grammar_constraint
from lmsp.engines.base import LoadOptions, Sampling
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_cpp import LlamaEngine, LlamaModel

GREEDY = Sampling(temperature=0)
SEEDED = Sampling(temperature=0.8, seed=1234)
EVERY = Sampling(temperature=0.9, seed=7, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.15)

SYSTEM = " ".join(
    f"Rule {i}: answer politely, briefly and truthfully about lighthouses and the sea."
    for i in range(30)
)


def model(sequences: int, **options: Any) -> LlamaModel:
    return LlamaEngine().load(
        bundled_model_path(), 2048, LoadOptions(sequences=sequences, **options)
    )


@pytest.fixture(scope="module")
def solo() -> Iterator[LlamaModel]:
    m = model(1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def batched() -> Iterator[LlamaModel]:
    m = model(4)
    yield m
    m.close()


def prompt(m: LlamaModel, question: str, system: str | None = None) -> list[int]:
    messages = [{"role": "user", "content": question}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return m.prompt_tokens(messages)


def run(
    m: LlamaModel,
    tokens: list[int],
    sampling: Sampling,
    limit: int,
    resume: list[int] | None = None,
    constraint: Any = None,
) -> tuple[list[int], int]:
    """The generated tokens (at most ``limit``) and the cached prompt tokens."""
    out: list[int] = []
    generation = m.generate(tokens, resume or [], sampling, constraint)
    try:
        for piece in generation:
            out.append(piece.token)
            if len(out) >= limit:
                break
    finally:
        generation.close()
    return out, generation.cached_tokens


def together(jobs: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    return results


QUESTIONS = [
    "Write a short poem about a lighthouse.",
    "Explain how tides work.",
    "List five birds that live by the sea.",
    "Tell a story about a lost boat.",
]
SAMPLINGS = [GREEDY, SEEDED, EVERY, GREEDY]


def test_batched_runs_give_the_tokens_of_solo_runs(solo: LlamaModel, batched: LlamaModel) -> None:
    prompts = [prompt(solo, q) for q in QUESTIONS]
    alone = [run(solo, p, s, 48)[0] for p, s in zip(prompts, SAMPLINGS, strict=True)]
    steps, tokens = batched.batcher.steps, batched.batcher.tokens
    jobs = [
        (lambda p=p, s=s: run(batched, p, s, 48)[0])
        for p, s in zip(prompts, SAMPLINGS, strict=True)
    ]
    assert together(jobs) == alone
    steps, tokens = batched.batcher.steps - steps, batched.batcher.tokens - tokens
    generated = sum(len(a) for a in alone)
    assert steps < generated  # the sequences really shared steps
    assert tokens >= generated


def test_cancelled_finishing_and_constrained_sequences_leave_the_others_intact(
    solo: LlamaModel, batched: LlamaModel
) -> None:
    long_prompt = prompt(solo, QUESTIONS[3])
    schema = {
        "type": "object",
        "properties": {"bird": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["bird", "count"],
        "additionalProperties": False,
    }
    build = grammar_constraint(grammar.json_grammar(schema))
    json_prompt = prompt(solo, "Name a sea bird and how many you saw, as JSON.")
    want_long = run(solo, long_prompt, GREEDY, 64)[0]
    want_json = run(solo, json_prompt, SEEDED, 64, constraint=build(solo))[0]
    want_short = run(solo, prompt(solo, QUESTIONS[1]), GREEDY, 10)[0]
    want_cancel = run(solo, prompt(solo, QUESTIONS[0]), SEEDED, 5)[0]

    got = together(
        [
            lambda: run(batched, long_prompt, GREEDY, 64)[0],
            lambda: run(batched, json_prompt, SEEDED, 64, constraint=build(batched))[0],
            lambda: run(batched, prompt(solo, QUESTIONS[1]), GREEDY, 10)[0],  # finishes
            lambda: run(batched, prompt(solo, QUESTIONS[0]), SEEDED, 5)[0],  # cancelled
        ]
    )
    assert got == [want_long, want_json, want_short, want_cancel]
    text = bytes(batched.llm.detokenize(got[1])).decode()
    assert text.startswith("{") and '"bird"' in text


def test_a_shared_prefix_is_reused_and_gives_the_cold_tokens(solo: LlamaModel) -> None:
    m = model(2)
    try:
        first = prompt(m, "Where is the nearest lighthouse?", SYSTEM)
        second = prompt(m, "How tall are lighthouses?", SYSTEM)
        run(m, first, GREEDY, 8)
        warm, cached = run(m, second, GREEDY, 32)
        shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
        assert shared > 300 and cached == shared
        assert warm == run(solo, second, GREEDY, 32)[0]  # solo's cache held another prompt
    finally:
        m.close()


def test_two_sequences_sharing_a_prefix_at_once_stay_exact(solo: LlamaModel) -> None:
    m = model(2)
    try:
        p = prompt(m, "Describe the sea at night.", SYSTEM)
        q = prompt(m, "Describe the sea at dawn.", SYSTEM)
        started = threading.Event()
        release = threading.Event()

        def long_running() -> list[int]:
            out: list[int] = []
            generation = m.generate(p, [], GREEDY)
            try:
                for piece in generation:
                    out.append(piece.token)
                    started.set()
                    if len(out) >= 40:
                        break
                    release.wait(60) if len(out) == 2 else None
            finally:
                generation.close()
            return out

        def copier() -> tuple[list[int], int]:
            started.wait(120)
            try:
                return run(m, q, GREEDY, 24)
            finally:
                release.set()

        first, (second, cached) = together([long_running, copier])
        assert cached == 0  # a running sequence's cache is not shared: evaluated anew
        assert second == run(solo, q, GREEDY, 24)[0]
        assert first == run(solo, p, GREEDY, 40)[0]
    finally:
        m.close()


def test_saved_prefixes_survive_a_restart_and_are_checked(tmp_path: Path, solo: LlamaModel) -> None:
    files = PrefixFiles(tmp_path / "kv", max_bytes=1 << 30, ttl=3600)
    digest = "sha256:" + "ab" * 32
    first = prompt(solo, "What colour are lighthouses?", SYSTEM)
    second = prompt(solo, "Who keeps lighthouses?", SYSTEM)
    third = prompt(solo, "Why do lighthouses blink?", SYSTEM)
    cold = run(solo, third, GREEDY, 24)[0]

    m = model(1, digest=digest, prefix_files=files)
    run(m, first, GREEDY, 4)  # saved whole
    run(m, second, GREEDY, 4)  # shares the system prompt: that prefix is saved
    m.close()  # waits for the saves
    saved = sorted((tmp_path / "kv").rglob("*.kv"), key=lambda p: p.stat().st_size)
    assert len(saved) == 2  # the first prompt, and the prefix it shares with the second

    m = model(1, digest=digest, prefix_files=files)  # a restart: nothing in memory
    try:
        warm, cached = run(m, third, GREEDY, 24)
    finally:
        m.close()
    shared = next(i for i, (a, b) in enumerate(zip(first, third, strict=False)) if a != b)
    assert cached == shared and warm == cold

    other = model(1, digest="sha256:" + "cd" * 32, prefix_files=files)  # another model
    try:
        assert run(other, third, GREEDY, 24) == (cold, 0)
    finally:
        other.close()

    for path in saved:  # damage every saved cache
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    m = model(1, digest=digest, prefix_files=files)
    try:
        assert run(m, third, GREEDY, 24) == (cold, 0)  # detected, ignored
    finally:
        m.close()
    assert files.counts["corrupt"] >= 1 and not saved[0].exists()


def test_a_resume_from_a_saved_generation_gives_the_uninterrupted_tokens(
    tmp_path: Path, solo: LlamaModel
) -> None:
    files = PrefixFiles(tmp_path / "kv", max_bytes=1 << 30, ttl=3600)
    digest = "sha256:" + "ef" * 32
    p = prompt(solo, QUESTIONS[3])
    m = model(1, digest=digest, prefix_files=files)
    m.save_every = 40
    try:
        whole = run(m, p, SEEDED, 150)[0]
    finally:
        m.close()
    assert whole == run(solo, p, SEEDED, 150)[0]
    m = model(1, digest=digest, prefix_files=files)  # restart, resume 130 tokens in
    try:
        rest, cached = run(m, p, SEEDED, 20, resume=whole[:130])
    finally:
        m.close()
    assert rest == whole[130:]
    assert cached == len(p)  # the prompt came from the saved generation
    assert files.counts["hits"] >= 1
