"""A context past the model's trained one: YaRN rope scaling (``LMSP_ROPE_SCALING``).

SmolLM2-135M was trained on 8,192 tokens. Served with a longer context and no scaling,
its positions past 8,192 are ones it never saw and it writes noise; with YaRN it reads
and answers. The cheap checks (when scaling applies, how far, what a saved prefix is
tagged with, the setting) run in the suite; the long-context check itself, a text
copied back from 12k tokens in, runs in ``make long`` (two 12k-token prompts), as does
Claude Code's 21k-token prompt (``tests/test_agents_real.py``).
"""

from __future__ import annotations

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.config import from_env
from lmsp.engines.base import LoadOptions, Sampling
from lmsp.engines.client import EngineClient
from lmsp.engines.llama_context import yarn_factor
from lmsp.engines.llama_cpp import LlamaEngine, LlamaModel, LlamaTokenizer, yarn_base
from lmsp.engines.worker import EngineSpec

LLAMA = {"general.architecture": "llama", "llama.context_length": "8192"}


@pytest.mark.parametrize(
    ("meta", "n_ctx", "on", "base"),
    [
        (LLAMA, 8192, True, 0),  # within the trained context: nothing to stretch
        (LLAMA, 4096, True, 0),
        (LLAMA, 8448, True, 8192),
        (LLAMA, 32768, True, 8192),
        (LLAMA, 32768, False, 0),  # LMSP_ROPE_SCALING=none
        ({**LLAMA, "llama.rope.scaling.type": "yarn"}, 32768, True, 0),  # the model's own
        ({**LLAMA, "llama.rope.scaling.type": "none"}, 32768, True, 8192),
        ({"general.architecture": "llama"}, 32768, True, 0),  # no trained context known
    ],
)
def test_when_yarn_applies(meta: dict[str, str], n_ctx: int, on: bool, base: int) -> None:
    assert yarn_base(meta, n_ctx, LoadOptions(rope_scaling=on)) == base


@pytest.mark.parametrize(
    ("n_ctx", "factor"), [(8193, 2), (9728, 2), (16384, 2), (16385, 4), (32768, 4), (65536, 8)]
)
def test_the_stretch_is_the_power_of_two_that_covers_the_context(n_ctx: int, factor: int) -> None:
    assert yarn_factor(n_ctx, 8192) == factor


def test_the_setting() -> None:
    assert from_env({}).rope_scaling is True
    assert from_env({"LMSP_ROPE_SCALING": "none"}).rope_scaling is False
    assert from_env({"LMSP_ROPE_SCALING": "yarn"}).rope_scaling is True
    with pytest.raises(ValueError, match="LMSP_ROPE_SCALING"):
        from_env({"LMSP_ROPE_SCALING": "linear"})


def test_saved_prefixes_of_a_stretched_context_are_tagged_apart() -> None:
    """A saved prefix holds positions rotated for its context: one saved under another
    stretch (or none) is never restored into this one (the prefix cache drops an entry
    whose tag differs)."""
    path = bundled_model_path()
    tags = {}
    for name, n_ctx, on in (("trained", 8192, True), ("x2", 16384, True), ("off", 16384, False)):
        model = LlamaModel(path, n_ctx, LoadOptions(sequences=1, rope_scaling=on))
        try:
            tags[name] = (model.yarn_from, model.tag)
        finally:
            model.close()
    assert tags["trained"][0] == 0 and tags["off"][0] == 0
    assert tags["x2"][0] == 8192 and tags["x2"][1].endswith(";yarn-8192x2")
    assert tags["trained"][1] == tags["off"][1] != tags["x2"][1]


PARAGRAPH = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk, carried a lamp"
    " of oil, wiped the great lens clean of salt, and wrote the weather, the ships and the"
    " wind in his book. "
)


def copied_back(n_ctx: int, prompt_tokens: int, scaled: bool) -> int:
    """The paragraph repeated to ``prompt_tokens`` tokens, then 24 greedy tokens: how
    many of them continue the repetition exactly."""
    path = bundled_model_path()
    load = LoadOptions(sequences=1, rope_scaling=scaled)
    tokenizer = LlamaTokenizer(path, n_ctx, options=load)
    unit = tokenizer.llm.tokenize(PARAGRAPH.encode(), add_bos=False)
    tokens = [tokenizer.llm.token_bos()] + unit * (prompt_tokens // len(unit))
    engine = EngineClient(EngineSpec(LlamaEngine(), path, n_ctx, load), tokenizer).start()
    try:
        generation = engine.generate(tokens, [], Sampling(temperature=0), None, max_tokens=24)
        out = [piece.token for piece in generation]
        generation.close()
    finally:
        engine.close()
    return sum(a == b for a, b in zip(out, (unit * 2)[:24], strict=False))


def test_a_short_prompt_in_a_stretched_context_is_read_as_before() -> None:
    assert copied_back(32768, 300, scaled=True) == 24


@pytest.mark.long  # two prompts of 12k tokens: ~2-5 min on two cores
def test_past_the_trained_context_yarn_reads_what_no_scaling_cannot() -> None:
    assert copied_back(16384, 12000, scaled=True) == 24
    assert copied_back(16384, 12000, scaled=False) == 0  # measured: noise
