"""The batching machinery without a model: steps gather the ready sequences, a failed
step fails exactly its requests, ``exclusive`` keeps steps out, and the pool hands a new
prompt the sequence holding its longest prefix."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lmsp.engines.batch import CHUNK, Batcher, Request, SequencePool, common_prefix


class Recorder:
    def __init__(self, delay: float = 0.01, fail_on: int | None = None) -> None:
        self.steps: list[list[tuple[int, int]]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.running = 0
        self.overlap = False

    def __call__(self, step: list[Request]) -> None:
        self.running += 1
        self.overlap |= self.running > 1
        try:
            time.sleep(self.delay)
            self.steps.append([(r.seq, len(r.tokens)) for r in step])
            if self.fail_on is not None and any(r.seq == self.fail_on for r in step):
                raise RuntimeError("decode failed")
            for r in step:
                if r.logits:
                    r.result = np.full(4, r.seq * 1000 + r.pos + len(r.tokens), np.float32)
        finally:
            self.running -= 1


def drive(batcher: Batcher, seq: int, steps: int, out: dict[int, list[float]]) -> None:
    with batcher.sequence():
        for pos in range(steps):
            logits = batcher.decode(seq, [1], pos, True)
            assert logits is not None
            out.setdefault(seq, []).append(float(logits[0]))


def test_ready_sequences_share_each_step() -> None:
    record = Recorder()
    batcher = Batcher(record, gather=0.05)
    out: dict[int, list[float]] = {}
    threads = [threading.Thread(target=drive, args=(batcher, s, 20, out)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for seq in range(4):  # each got its own logits, in order
        assert out[seq] == [seq * 1000 + pos + 1 for pos in range(20)]
    assert not record.overlap  # one step at a time
    assert batcher.tokens == 80
    assert batcher.steps <= 30  # mostly four sequences a step (80 alone)
    assert max(len(step) for step in record.steps) == 4


def test_a_failed_step_fails_its_requests_only() -> None:
    record = Recorder(fail_on=1)
    batcher = Batcher(record, gather=0.0)
    with pytest.raises(RuntimeError):
        batcher.decode(1, [5], 0, True)
    assert batcher.decode(2, [5], 0, True) is not None  # the next step is fine


def test_steps_respect_the_token_budget() -> None:
    record = Recorder(delay=0.0)
    batcher = Batcher(record, max_tokens=CHUNK + 1, gather=0.05)
    out: list[object] = []

    def prefill(seq: int) -> None:
        with batcher.sequence():
            out.append(batcher.decode(seq, [1] * CHUNK, 0, True))

    threads = [threading.Thread(target=prefill, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 3 and all(sum(n for _, n in step) <= CHUNK + 1 for step in record.steps)


def test_exclusive_keeps_steps_out() -> None:
    record = Recorder(delay=0.0)
    batcher = Batcher(record, gather=0.0)
    done = threading.Event()

    def step() -> None:
        batcher.decode(0, [1], 0, False)
        done.set()

    with batcher.exclusive():
        thread = threading.Thread(target=step)
        thread.start()
        assert not done.wait(0.2)  # waits for the exclusive section
    thread.join(10)
    assert done.is_set()


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


def test_a_short_shared_start_is_not_reused() -> None:
    pool = SequencePool(1)
    first = pool.take(list(range(50)))
    pool.give_back(first.slot, list(range(50)))
    assert pool.take(list(range(40))).cached == 0  # under MIN_REUSE


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 5]) == 1
    assert common_prefix([1, 2], [1, 2, 3]) == 2
