"""A stream whose consumer paced it keeps the engine's steps until the time it was
given, then hands them over at once; the end of the sequence wakes it at once.

Before, the reader thread woke the runner thread for every step of every sequence
(``Stream.put``); a runner that logs its events every ``flush_interval`` needed them
only then."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp.engines.base import Sampling
from lmsp.engines.client import EngineClient
from tests.engines.test_core import FakeBackend, thread_client

GREEDY = Sampling()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[EngineClient]:
    """An engine (on a thread) that takes a step every 10 ms: a piece a sequence."""
    backend = FakeBackend(sequences=2)
    backend.delay = 0.01
    engine = thread_client(backend, tmp_path)
    try:
        yield engine
    finally:
        engine.close()


def test_paced_pieces_come_all_at_once_when_the_sequence_ends(client: EngineClient) -> None:
    stream = client.generate([40, 0], [], GREEDY)  # 40 pieces in about 0.4 s
    first = next(stream)  # not paced: the first piece as it comes
    assert first.text == "0 " and stream.ready() == 0
    stream.pace(time.monotonic() + 3600)  # needed in an hour, unless it ends
    second = next(stream)  # ... so the end wakes it, with every piece before it
    assert second.text == "1 "
    assert stream.ready() == 38
    assert [p.text for p in stream] == [f"{i} " for i in range(2, 40)]


def test_paced_pieces_come_at_the_paced_time(client: EngineClient) -> None:
    stream = client.generate([400, 0], [], GREEDY)
    next(stream)
    due = time.monotonic() + 0.3
    stream.pace(due)
    piece = next(stream)
    assert time.monotonic() >= due  # not before: the steps were kept
    kept = stream.ready()
    assert piece.text == "1 " and kept >= 1  # what came meanwhile, all at once
    stream.pace(-math.inf)  # from now on each piece as it comes
    assert [next(stream).text for _ in range(kept + 3)][-1] == f"{kept + 4} "
    stream.cancel()
    assert len(list(stream)) < 400  # the cancel's end wakes it


def test_a_paced_stream_that_is_interrupted_ends_at_once(client: EngineClient) -> None:
    stream = client.generate([400, 0], [], GREEDY)
    next(stream)
    stream.pace(time.monotonic() + 3600)
    stream.interrupt()  # the service is shutting down
    started = time.monotonic()
    rest = list(stream)
    assert time.monotonic() - started < 60  # not the hour it was paced for
    assert len(rest) < 399
