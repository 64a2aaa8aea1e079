"""A generation begun before its task is committed (engines/early.py, the engine client's
``begin_early``): the attempt asking for exactly its inputs is given it, anything else
gets a sequence of its own, and one nobody adopted is cancelled in the engine."""

from __future__ import annotations

import time
from pathlib import Path

from lmsp.engines.base import Sampling
from lmsp.engines.client import EngineClient
from lmsp.engines.early import Inputs
from tests.engines.test_core import GREEDY, FakeBackend, thread_client


def until_free(client: EngineClient, count: int) -> None:
    deadline = time.monotonic() + 10
    while client.stats()["free"] != count:
        assert time.monotonic() < deadline, client.stats()
        time.sleep(0.01)


def test_the_same_inputs_get_the_generation_begun_early(tmp_path: Path) -> None:
    backend = FakeBackend(sequences=2)
    client = thread_client(backend, tmp_path)
    try:
        drop = client.begin_early([5, 0], GREEDY, None, 10)
        assert drop is not None
        begun = client.early.adopt(Inputs((5, 0), (), GREEDY, None, 10))
        assert begun is not None
        assert client.early.hold(Inputs((5, 0), (), GREEDY, None, 10), begun)  # back
        stream = client.generate([5, 0], [], GREEDY, max_tokens=10)
        assert stream is begun  # adopted: no second sequence
        assert not client.early  # nothing held any more
        assert [p.text for p in stream] == ["0 ", "1 ", "2 ", "3 ", "4 "]
        assert drop() is False  # adopted: not its starter's to close
        until_free(client, 2)
        assert len(backend.steps) <= 6  # one sequence's steps, not two
    finally:
        client.close()


def test_other_inputs_start_anew_and_the_early_one_is_cancelled(tmp_path: Path) -> None:
    backend = FakeBackend(sequences=2)
    backend.delay = 0.01  # 60 tokens: still running when it is dropped
    client = thread_client(backend, tmp_path)
    try:
        drop = client.begin_early([60, 0], GREEDY, None, 60)
        assert drop is not None
        other = Sampling(temperature=0, seed=7)
        for asked in (
            client.generate([60, 0], [], GREEDY, max_tokens=59),  # another budget
            client.generate([60, 0], [], other, max_tokens=60),  # other sampling
            client.generate([60, 0], [3], GREEDY, max_tokens=60),  # a resume's tokens
            client.generate([60, 0], [], GREEDY, grammar="root ::= x", max_tokens=60),
        ):
            assert client.early  # still held: none of those asked for it
            asked.close()
        assert drop() is True  # closed unadopted: its sequence cancelled in the engine
        assert not client.early and drop() is False  # once
        until_free(client, 2)
    finally:
        client.close()


def test_one_generation_at_most_is_begun_for_the_same_inputs(tmp_path: Path) -> None:
    backend = FakeBackend(sequences=2)
    backend.delay = 0.01
    client = thread_client(backend, tmp_path)
    try:
        first = client.begin_early([60, 0], GREEDY, None, 60)
        assert first is not None
        assert client.begin_early([60, 0], GREEDY, None, 60) is None  # its own closed
        deadline = time.monotonic() + 10
        while client.stats()["free"] != 1:  # the second one's sequence given back
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert first() is True
        until_free(client, 2)
    finally:
        client.close()
