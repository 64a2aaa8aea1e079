"""An engine process started ahead (engines/ahead.py): the next engine to start is that
process, sent its spec, and serves as a spawned one does; one that died meanwhile is
not used; closing the host ends the one waiting; and one is started again once the
engine it became is up.

The deterministic test engine in real processes, as ``lmsp serve`` runs it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp.engines.ahead import Ahead
from lmsp.engines.base import LoadOptions, Sampling
from lmsp.engines.client import EngineClient
from lmsp.engines.deterministic import TEST_MODEL_BYTES, DeterministicEngine, DeterministicModel
from lmsp.engines.worker import EngineSpec
from tests.helpers import children, exited, wait_exited

GREEDY = Sampling(temperature=0.0)


@pytest.fixture
def spec(tmp_path: Path) -> EngineSpec:
    model = tmp_path / "test.model"
    model.write_bytes(TEST_MODEL_BYTES)
    return EngineSpec(DeterministicEngine(), model, 0, LoadOptions(2), "lmsp-test")


@pytest.fixture
def ahead() -> Iterator[Ahead]:
    made = Ahead()
    try:
        yield made
    finally:
        made.close()


def waiting_pid(ahead: Ahead, timeout: float = 30) -> int:
    """The pid of the process ``ahead`` holds once it is started."""
    deadline = time.monotonic() + timeout
    while True:
        pid = ahead.pid
        if pid is not None:
            return pid
        assert time.monotonic() < deadline, "no process was started ahead"
        time.sleep(0.02)


def text(client: EngineClient) -> str:
    prompt = client.prompt_tokens([{"role": "user", "content": "hello"}])
    return "".join(p.text for p in client.generate(prompt, [], GREEDY))


def test_the_next_engine_is_the_process_started_ahead_and_one_follows(
    spec: EngineSpec, ahead: Ahead
) -> None:
    spawned = EngineClient(spec, DeterministicModel()).start(60)  # no process waits yet
    try:
        expected = text(spawned)
    finally:
        spawned.close()
    ahead.refill(0, after=0)
    waiting = waiting_pid(ahead)
    assert waiting in children(os.getpid())
    client = EngineClient(spec, DeterministicModel(), ahead=ahead).start(60)
    try:
        assert client.pid == waiting and ahead.taken == 1
        assert text(client) == expected  # it serves as a spawned engine does
        follower = waiting_pid(ahead)  # once it was up, another was started ahead
        assert follower != waiting
    finally:
        client.close()
    assert exited(waiting)


def test_a_process_that_died_while_waiting_is_not_used(spec: EngineSpec, ahead: Ahead) -> None:
    ahead.refill(0, after=0)
    waiting = waiting_pid(ahead)
    os.kill(waiting, signal.SIGKILL)
    assert wait_exited(waiting, 10)
    client = EngineClient(spec, DeterministicModel(), ahead=ahead).start(60)
    try:
        assert client.pid not in (None, waiting) and ahead.taken == 0
        assert text(client)
    finally:
        client.close()


def test_a_process_waiting_at_another_priority_is_not_used_and_is_replaced(
    spec: EngineSpec, ahead: Ahead
) -> None:
    """A remote model's engine keeps the API's priority, a local one's is below it: a
    process started ahead for the one is not the other's (its threads run at its own)."""
    ahead.refill(5, after=0)
    below = waiting_pid(ahead)
    client = EngineClient(spec, DeterministicModel(), ahead=ahead).start(60)  # nice 0
    try:
        assert client.pid != below and ahead.taken == 0
        assert wait_exited(below, 10)  # replaced by one at this engine's priority
        level = waiting_pid(ahead)
        assert os.getpriority(os.PRIO_PROCESS, level) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        client.close()


def test_closing_ends_the_process_waiting_and_starts_no_other(ahead: Ahead) -> None:
    ahead.refill(0, after=0)
    waiting = waiting_pid(ahead)
    ahead.close()
    assert exited(waiting)
    ahead.refill(0, after=0)
    time.sleep(0.2)
    assert ahead.pid is None
