"""The sampler: penalties over the generated tokens, top_k, top_p, min_p, keyed by
``(seed, position)``, and log probabilities."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmsp.engines.base import Sampling, penalized, sample, top_logprobs


def logits(*values: float) -> np.ndarray:  # type: ignore[type-arg]
    return np.array(values, dtype=np.float32)


def draws(scores: np.ndarray, sampling: Sampling, n: int = 400) -> set[int]:  # type: ignore[type-arg]
    return {sample(scores, sampling, position) for position in range(n)}


def test_greedy_takes_the_best_token_and_penalties_apply_first() -> None:
    scores = logits(1.0, 3.0, 2.5, -1.0)
    assert sample(scores, Sampling(temperature=0), 0) == 1
    # token 1 was generated twice: a frequency penalty of 0.5 costs it 1.0
    assert sample(scores, Sampling(temperature=0, frequency_penalty=0.5), 0, [1, 1]) == 2
    # a presence penalty costs once, however often
    assert sample(scores, Sampling(temperature=0, presence_penalty=0.4), 0, [1, 1, 1]) == 1
    assert sample(scores, Sampling(temperature=0, presence_penalty=0.6), 0, [1]) == 2
    # llama.cpp's repeat penalty divides a positive logit
    assert sample(scores, Sampling(temperature=0, repeat_penalty=1.3), 0, [1]) == 2
    assert sample(scores, Sampling(temperature=0, repeat_penalty=1.1), 0, [1]) == 1


def test_penalized_values() -> None:
    scores = logits(2.0, -2.0, 1.0)
    out = penalized(scores, Sampling(repeat_penalty=2.0), [0, 1])
    assert out.tolist() == [1.0, -4.0, 1.0]
    out = penalized(scores, Sampling(frequency_penalty=0.5, presence_penalty=0.25), [0, 0, 2])
    assert out.tolist() == [2.0 - 1.0 - 0.25, -2.0, 1.0 - 0.5 - 0.25]
    # nothing generated (or neutral values): unchanged; tokens beyond the vocabulary ignored
    assert penalized(scores, Sampling(repeat_penalty=2.0), []).tolist() == [2.0, -2.0, 1.0]
    assert penalized(scores, Sampling(), [0, 1]).tolist() == [2.0, -2.0, 1.0]
    assert penalized(scores, Sampling(repeat_penalty=2.0), [7]).tolist() == [2.0, -2.0, 1.0]


def test_top_k_min_p_and_top_p_cut_the_candidates() -> None:
    scores = logits(0.0, 0.1, 0.2, 0.3, 0.4)  # nearly flat
    free = Sampling(temperature=1.0, seed=3)
    assert draws(scores, free) == {0, 1, 2, 3, 4}
    assert draws(scores, Sampling(temperature=1.0, seed=3, top_k=2)) == {3, 4}
    assert draws(scores, Sampling(temperature=1.0, seed=3, top_k=1)) == {4}
    peaked = logits(0.0, 0.0, 3.0, 2.9, -5.0)
    # min_p 0.5: only tokens at least half as likely as the best
    assert draws(peaked, Sampling(temperature=1.0, seed=3, min_p=0.5)) == {2, 3}
    assert draws(peaked, Sampling(temperature=1.0, seed=3, top_p=0.5)) == {2, 3}


def test_the_same_seed_and_position_draw_the_same_token() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=500).astype(np.float32)
    sampling = Sampling(
        temperature=0.8,
        seed=42,
        top_k=50,
        min_p=0.02,
        top_p=0.95,
        repeat_penalty=1.1,
        presence_penalty=0.3,
        frequency_penalty=0.2,
    )
    generated = [int(t) for t in rng.integers(0, 500, size=30)]
    first = [sample(scores, sampling, position, generated) for position in range(50)]
    again = [sample(scores, sampling, position, list(generated)) for position in range(50)]
    assert first == again
    other = [
        sample(scores, Sampling(**{**sampling.__dict__, "seed": 43}), p, generated)
        for p in range(50)
    ]
    assert first != other


def test_top_logprobs() -> None:
    scores = logits(math.log(0.5), math.log(0.25), math.log(0.25), -np.inf)
    chosen, best = top_logprobs(scores, 1, 3)
    assert chosen == pytest.approx(math.log(0.25))
    assert [t for t, _ in best] == [0, 1, 2]  # a masked token is never listed
    assert [lp for _, lp in best] == pytest.approx([math.log(0.5), math.log(0.25), math.log(0.25)])
    assert top_logprobs(scores, 0, 0)[1] == []
