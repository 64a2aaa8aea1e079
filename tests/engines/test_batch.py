"""The batching pieces without a model: the exact step policy (a prompt chunk alone,
single tokens together, turns alternating, the budget kept), and the pool handing a new
prompt the sequence holding its longest prefix. The loop that uses them is tested in
``test_core.py``."""

from __future__ import annotations

from lmsp.engines.batch import (
    CHUNK,
    MIN_REUSE,
    ExactSteps,
    FastSteps,
    Request,
    SequencePool,
    common_prefix,
)
from lmsp.engines.llama_cpp import SPLIT_KV_CELLS, single_step_fillers


def test_a_prompt_chunk_runs_alone_and_is_at_most_a_chunk() -> None:
    policy = ExactSteps()
    assert policy.form([100, 1, 1], 512) == [(0, CHUNK)]
    assert policy.form([5, 1], 512) == [(0, 5)]
    assert policy.form([100], 10) == [(0, 10)]  # the budget


def test_single_tokens_run_together_and_a_chunk_waits_its_turn() -> None:
    policy = ExactSteps()
    assert policy.form([1, 40, 1, 1], 512) == [(0, 1), (2, 1), (3, 1)]
    assert policy.form([1, 1, 1], 2) == [(0, 1), (1, 1)]  # the budget
    assert policy.form([], 512) == []


def test_single_token_steps_get_fillers_for_gaps_and_for_a_long_lone_sequence() -> None:
    held = {0: 10, 1: 900, 2: 0, 3: 40, 4: 7}

    def fill(seqs: list[int], pos: int = 5) -> list[tuple[int, int]]:
        step = [Request(s, [1], pos, True) for s in seqs]
        return [(f.seq, f.pos) for f in single_step_fillers(step, 5, held.__getitem__)]

    assert fill([0, 1, 2]) == []  # one run already
    assert fill([0, 3]) == [(1, 900), (2, 0)]  # one pass instead of two
    assert fill([3]) == []  # a short lone sequence: the usual kernel anyway
    assert fill([3], SPLIT_KV_CELLS) == [(2, 0)]  # the neighbour holding less
    assert fill([0], SPLIT_KV_CELLS) == [(1, 900)]  # the only neighbour
    assert all(
        f.tokens == [0] and not f.logits
        for f in single_step_fillers(
            [Request(0, [1], 0, True), Request(2, [1], 0, True)], 5, held.__getitem__
        )
    )


def test_the_pool_reuses_the_longest_prefix_and_evicts_the_least_recently_used() -> None:
    pool = SequencePool(3)
    long = list(range(100))
    a = pool.take(long)
    assert a.cached == 0
    pool.hold(a.slot, long)
    pool.give_back(a.slot, long)
    b = pool.take([9, 9])
    pool.give_back(b.slot, [9, 9])
    assert b.slot is not a.slot  # a's tokens stay: an unused sequence was taken
    again = pool.take([*long[:70], 7, 7])
    assert again.slot is a.slot and again.cached == 70
    c = pool.take([5])  # shares nothing: the least recently used free one
    assert c.slot is not b.slot and c.slot is not a.slot
    pool.give_back(c.slot, [5])
    pool.give_back(again.slot, [*long[:70], 7, 7])
    d = pool.take([4])
    assert d.slot is b.slot  # least recently given back among those sharing nothing


def test_only_a_shared_start_of_min_reuse_tokens_is_reused() -> None:
    pool = SequencePool(1)
    first = pool.take(list(range(50)))
    pool.give_back(first.slot, list(range(50)))
    short = pool.take(list(range(MIN_REUSE - 1)))
    assert short.cached == 0  # under MIN_REUSE
    pool.give_back(short.slot, list(range(50)))
    assert pool.take([*range(MIN_REUSE), 99]).cached == MIN_REUSE  # a system prompt's worth


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 5]) == 1
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_the_fast_schedule_fills_a_step_with_prompt_beside_the_generating_tokens() -> None:
    policy = FastSteps()
    # every generating token, then prompts oldest first in full micro-batches
    assert policy.form([100, 1, 1], 512) == [(1, 1), (2, 1), (0, 100)]
    assert policy.form([1, 900, 300, 1], 512) == [(0, 1), (3, 1), (1, 510)]
    assert policy.form([600, 300], 512) == [(0, 512)]
    assert policy.form([1, 1, 1], 2) == [(0, 1), (1, 1)]  # the budget
    assert policy.form([], 512) == []
    assert policy.form([2, 2], 3) == [(0, 2), (1, 1)]
