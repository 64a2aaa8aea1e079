"""The waiting workers and the claim a create hands one of them (runner/idlers.py): a
claim is submitted only for a worker bound to run it, and never lost, even when the
worker's wait runs out as it is handed."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest

from lmsp.runner.idlers import Idlers


def worker(idlers: Idlers, timeout: float) -> tuple[threading.Thread, list[Any]]:
    """A worker thread in ``idlers.wait(timeout)``; what it got lands in the list."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(idlers.wait(timeout)))
    thread.start()
    return thread, got


def until_waiting(idlers: Idlers, count: int = 1) -> None:
    deadline = time.monotonic() + 10
    while idlers.waiting() < count:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_no_worker_waits_no_claim_is_submitted() -> None:
    idlers = Idlers()
    submitted: list[int] = []

    def submit() -> concurrent.futures.Future[Any]:
        submitted.append(1)
        return concurrent.futures.Future()

    assert idlers.hand(submit) is None
    assert submitted == []


def test_a_waiting_worker_gets_the_claim_and_a_wake_gets_none() -> None:
    idlers = Idlers()
    thread, got = worker(idlers, 30)
    until_waiting(idlers)
    claim: concurrent.futures.Future[Any] = concurrent.futures.Future()
    assert idlers.hand(lambda: claim, "its first turn") is claim
    thread.join(10)
    assert got == [(claim, "its first turn")]  # what came with it too
    thread, got = worker(idlers, 30)
    until_waiting(idlers)
    idlers.wake()
    thread.join(10)
    assert got == [None]
    assert idlers.hand(lambda: claim) is None  # nobody waits any more


def test_a_claim_handed_as_the_wait_runs_out_is_not_lost() -> None:
    """The worker is taken, then its wait times out while the claim is being submitted:
    it waits for what it is handed rather than going off without it (a claim no worker
    runs would leave its task claimed and idle)."""
    idlers = Idlers()
    thread, got = worker(idlers, 0.05)
    until_waiting(idlers)
    claim: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def slow_submit() -> concurrent.futures.Future[Any]:
        time.sleep(0.3)  # the worker's wait ends meanwhile
        return claim

    assert idlers.hand(slow_submit) is claim
    thread.join(10)
    assert got == [(claim, None)]


def test_a_submit_that_fails_wakes_the_worker_empty_handed() -> None:
    idlers = Idlers()
    thread, got = worker(idlers, 30)
    until_waiting(idlers)

    def broken() -> concurrent.futures.Future[Any]:
        raise RuntimeError("database is closed")

    with pytest.raises(RuntimeError):
        idlers.hand(broken)
    thread.join(10)
    assert got == [None]


def test_wake_all_frees_every_waiting_worker() -> None:
    idlers = Idlers()
    workers = [worker(idlers, 30) for _ in range(3)]
    until_waiting(idlers, 3)
    idlers.wake_all()
    for thread, got in workers:
        thread.join(10)
        assert got == [None]
