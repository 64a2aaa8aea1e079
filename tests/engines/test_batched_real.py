"""The batched engine on the real model (llama.cpp, the bundled GGUF), in engine
processes of its own driven through the engine client, as the service drives it.

Sequences stepped together must give exactly the tokens each gives alone; a sequence
that is cancelled, finishes or is constrained must not disturb the others; a prompt
that starts from a cached prefix — a finished sequence's, or one saved on disk before
a restart — must give exactly what a cold evaluation gives; and a saved
prefix of another model or another prompt, or a damaged file, is never used.

All of it in exact mode (``LMSP_EXACT=1``, ``LoadOptions.exact``): the guarantee it
keeps. The fast default's own checks are in ``test_fast_real.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.constraints import grammar
from lmsp.engines.base import Generation, LoadOptions, Sampling
from lmsp.engines.client import EngineClient
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_cpp import LlamaEngine, LlamaTokenizer
from lmsp.engines.worker import EngineSpec

GREEDY = Sampling(temperature=0)
SEEDED = Sampling(temperature=0.8, seed=1234)
EVERY = Sampling(temperature=0.9, seed=7, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.15)

SYSTEM = " ".join(
    f"Rule {i}: answer politely, briefly and truthfully about lighthouses and the sea."
    for i in range(30)
)


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[LlamaTokenizer]:
    t = LlamaTokenizer(bundled_model_path(), 2048)
    yield t
    t.close()


def model(sequences: int, **options: Any) -> EngineClient:
    """The bundled model in an engine process of its own."""
    path = bundled_model_path()
    load = LoadOptions(sequences=sequences, exact=True, **options)
    spec = EngineSpec(LlamaEngine(), path, 2048, load)
    return EngineClient(spec, LlamaTokenizer(path, 2048, options=load)).start()


@pytest.fixture(scope="module")
def solo() -> Iterator[EngineClient]:
    m = model(1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def batched() -> Iterator[EngineClient]:
    m = model(4)
    yield m
    m.close()


def prompt(m: EngineClient, question: str, system: str | None = None) -> list[int]:
    messages = [{"role": "user", "content": question}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return m.prompt_tokens(messages)


def start(
    m: EngineClient,
    tokens: list[int],
    sampling: Sampling,
    limit: int,
    resume: list[int] | None = None,
    grammar_text: str | None = None,
) -> Generation:
    return m.generate(tokens, resume or [], sampling, grammar_text, max_tokens=limit)


def drain(generation: Generation, limit: int | None = None) -> tuple[list[int], int]:
    """The generated tokens (at most ``limit``: then the rest is cancelled) and the
    cached prompt tokens."""
    out: list[int] = []
    try:
        for piece in generation:
            out.append(piece.token)
            if limit is not None and len(out) >= limit:
                break
    finally:
        generation.close()
    return out, generation.cached_tokens


def run(m: EngineClient, *args: Any, **kwargs: Any) -> tuple[list[int], int]:
    """:func:`start` a sequence, then :func:`drain` it."""
    return drain(start(m, *args, **kwargs))


QUESTIONS = [
    "Write a short poem about a lighthouse.",
    "Explain how tides work.",
    "List five birds that live by the sea.",
    "Tell a story about a lost boat.",
]
SAMPLINGS = [GREEDY, SEEDED, EVERY, GREEDY]


def test_batched_runs_give_the_tokens_of_solo_runs(
    solo: EngineClient, batched: EngineClient
) -> None:
    prompts = [prompt(solo, q) for q in QUESTIONS]
    alone = [run(solo, p, s, 48)[0] for p, s in zip(prompts, SAMPLINGS, strict=True)]
    before = batched.stats()
    streams = [start(batched, p, s, 48) for p, s in zip(prompts, SAMPLINGS, strict=True)]
    assert [drain(g)[0] for g in streams] == alone
    after = batched.stats()
    steps, tokens = after["steps"] - before["steps"], after["tokens"] - before["tokens"]
    generated = sum(len(a) for a in alone)
    assert steps < generated  # the sequences really shared steps
    assert tokens >= generated


def test_cancelled_finishing_and_constrained_sequences_leave_the_others_intact(
    solo: EngineClient, batched: EngineClient, tokenizer: LlamaTokenizer
) -> None:
    long_prompt = prompt(solo, QUESTIONS[3])
    schema = {
        "type": "object",
        "properties": {"bird": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["bird", "count"],
        "additionalProperties": False,
    }
    json_grammar = grammar.json_grammar(schema)
    json_prompt = prompt(solo, "Name a sea bird and how many you saw, as JSON.")
    want_long = run(solo, long_prompt, GREEDY, 64)[0]
    want_json = run(solo, json_prompt, SEEDED, 64, grammar_text=json_grammar)[0]
    want_short = run(solo, prompt(solo, QUESTIONS[1]), GREEDY, 10)[0]
    want_cancel = run(solo, prompt(solo, QUESTIONS[0]), SEEDED, 5)[0]

    streams = [
        start(batched, long_prompt, GREEDY, 64),
        start(batched, json_prompt, SEEDED, 64, grammar_text=json_grammar),
        start(batched, prompt(solo, QUESTIONS[1]), GREEDY, 10),  # finishes
        start(batched, prompt(solo, QUESTIONS[0]), SEEDED, 1000),  # cancelled after 5
    ]
    cancelled = drain(streams[3], 5)[0]  # the engine drops it while the others run
    got = [drain(g)[0] for g in streams[:3]]
    assert [*got, cancelled] == [want_long, want_json, want_short, want_cancel]
    text = bytes(tokenizer.llm.detokenize(got[1])).decode()
    assert text.startswith("{") and '"bird"' in text


def test_a_shared_prefix_is_reused_and_gives_the_cold_tokens(solo: EngineClient) -> None:
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


def test_two_sequences_sharing_a_prefix_at_once_stay_exact(solo: EngineClient) -> None:
    """A sequence generating while another's long prompt (sharing its prefix) is
    evaluated beside it: both stay equal to their lone runs."""
    m = model(2)
    try:
        p = prompt(m, "Describe the sea at night.", SYSTEM)
        q = prompt(m, "Describe the sea at dawn.", SYSTEM)
        long_running = start(m, p, GREEDY, 40)
        first = [next(long_running).token]  # it generates: the other arrives meanwhile
        second, cached = run(m, q, GREEDY, 24)
        first += drain(long_running)[0]
        assert cached == 0  # a running sequence's cache is not shared: evaluated anew
        assert second == run(solo, q, GREEDY, 24)[0]
        assert first == run(solo, p, GREEDY, 40)[0]
    finally:
        m.close()


def test_saved_prefixes_survive_a_restart_and_are_checked(
    tmp_path: Path, solo: EngineClient
) -> None:
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
        corrupt = m.stats()["prefix_cache"].get("corrupt", 0)
    finally:
        m.close()
    assert corrupt >= 1 and not saved[0].exists()


def test_a_resume_from_a_saved_generation_gives_the_uninterrupted_tokens(
    tmp_path: Path, solo: EngineClient
) -> None:
    files = PrefixFiles(tmp_path / "kv", max_bytes=1 << 30, ttl=3600)
    digest = "sha256:" + "ef" * 32
    p = prompt(solo, QUESTIONS[3])
    m = model(1, digest=digest, prefix_files=files)
    try:
        whole = run(m, p, SEEDED, 150)[0]  # saved 128 tokens in (save_every)
    finally:
        m.close()
    assert whole == run(solo, p, SEEDED, 150)[0]
    m = model(1, digest=digest, prefix_files=files)  # restart, resume 130 tokens in
    try:
        rest, cached = run(m, p, SEEDED, 20, resume=whole[:130])
        hits = m.stats()["prefix_cache"].get("hits", 0)
    finally:
        m.close()
    assert rest == whole[130:]
    assert cached == len(p)  # the prompt came from the saved generation
    assert hits >= 1


def test_a_long_context_resume_gives_the_uninterrupted_tokens(solo: EngineClient) -> None:
    """Past 256 cached tokens llama.cpp decodes a lone token with another attention
    kernel than a chunk: the engine never lets it, so a resume that re-evaluates a long
    prompt and snapshot in chunks still gives the uninterrupted tokens."""
    p = prompt(solo, QUESTIONS[3], SYSTEM)
    assert len(p) > 300
    whole = run(solo, p, EVERY, 48)[0]
    run(solo, prompt(solo, QUESTIONS[0]), GREEDY, 1)  # its one sequence holds another prompt
    rest, cached = run(solo, p, EVERY, 8, resume=whole[:40])
    assert cached == 0 and rest == whole[40:]
