"""The regular workers waiting for a task, and a claim handed to one of them.

A worker with nothing to do waits here (:meth:`Idlers.wait`) until a task is queued
(:meth:`Idlers.wake`: it looks for one itself, a claim of its own) or until a create
hands it a claim that rides in the create's own commit (:meth:`Idlers.hand`): the
writer commits the response, its task and the claim together, and the worker starts on
what it claimed as soon as that commit is answered — one transaction, and one thread
woken, fewer on the way to a response's first token (``Runner.claim_beside``). What else
the create hands with it (its first turn: :mod:`lmsp.runner.early`) comes along.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

#: a claim's future, and what came with it
Handed = tuple[concurrent.futures.Future[Any], Any]


class _Idle:
    __slots__ = ("event", "handed")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.handed: Handed | None = None


class Idlers:
    """Waiting workers, the one idle last first (its caches are the warmest)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Idle] = []

    def wait(self, timeout: float) -> Handed | None:
        """Wait for a wake or ``timeout`` seconds: the claim a create handed this worker
        (its future, answered once the writer committed it, and what came with it), or
        ``None``."""
        idle = _Idle()
        with self._lock:
            self._waiting.append(idle)
        idle.event.wait(timeout)
        with self._lock:
            if idle in self._waiting:  # timed out, and no one took it since
                self._waiting.remove(idle)
                return None
        idle.event.wait()  # taken: set once what it is handed (if anything) is there
        return idle.handed

    def wake(self) -> None:
        """A task was queued: one waiting worker looks for it."""
        idle = self._take()
        if idle is not None:
            idle.event.set()

    def wake_all(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for idle in waiting:
            idle.event.set()

    def hand(
        self, submit: Callable[[], concurrent.futures.Future[Any]], extra: Any = None
    ) -> concurrent.futures.Future[Any] | None:
        """Take a waiting worker, then submit its claim (``submit``: the claim's future)
        and give that to it, with ``extra``: a claim is only ever submitted for a worker
        bound to run what it claims. ``None`` when no worker waits (nothing is
        submitted)."""
        idle = self._take()
        if idle is None:
            return None
        try:
            idle.handed = (submit(), extra)
        finally:  # a submit that raised wakes it empty-handed: it looks for itself
            idle.event.set()
        return idle.handed[0]

    def _take(self) -> _Idle | None:
        with self._lock:
            return self._waiting.pop() if self._waiting else None

    def waiting(self) -> int:
        """How many workers wait now."""
        with self._lock:
            return len(self._waiting)
