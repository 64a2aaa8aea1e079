"""Untrusted-input work budgeted per request and queued fairly between clients.

The sandbox's workers (:mod:`lmsp.sandbox`) read files and compile schemas for every
client. Two things made that shared queue unfair (red team, third round): each job had
its own CPU limit but a request had none (12 PDFs of ~3 s each: 88 s of worker time for
one request), and jobs were served first come, first served, so 16 such requests made
another client's request with a trivial tool wait 31.6 s; a job's time limit started
only when a worker picked it up.

A :class:`Ticket` is one request's budget: the CPU time all of its jobs may take
together (``LMSP_REQUEST_CPU_TIME``) and a deadline counted from its arrival (that CPU
time times the sandbox's wall factor, plus a second), which bounds its wait for a worker
as well as its jobs. A :class:`FairGate` lets at most one job per worker run, and when
a worker frees it takes the next job round robin *by client*: a client with many jobs
queued waits behind its own jobs, never another client's single one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field


class QueueTimeout(Exception):
    """No worker came free before the request's deadline."""


@dataclass
class Ticket:
    """One request's budget for its files and schemas (see the module docstring)."""

    owner: str  # the client: the fair queue's key
    cpu_seconds: float  # what every job of the request may take together
    deadline: float  # ``time.monotonic()`` by which all of them must be done
    spent: float = 0.0  # CPU seconds its jobs took so far
    jobs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def arriving(cls, owner: str, cpu_seconds: float, wall_factor: float) -> Ticket:
        """A request arriving now."""
        return cls(owner, cpu_seconds, time.monotonic() + cpu_seconds * wall_factor + 1.0)

    def left(self) -> float:
        """CPU seconds its next jobs may take."""
        with self._lock:
            return self.cpu_seconds - self.spent

    def exhaust(self) -> None:
        """A job went past what was left: nothing is left."""
        with self._lock:
            self.spent = max(self.spent, self.cpu_seconds)

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.spent += max(0.0, seconds)
            self.jobs += 1


class FairGate:
    """At most ``slots`` jobs at once; waiting jobs are let in round robin by owner.
    Used from one event loop."""

    def __init__(self, slots: int) -> None:
        self.free = max(1, slots)
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self.granted: list[str] = []  # the owners let in, in order (the last 1000)

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def enter(self, owner: str, deadline: float | None = None) -> None:
        """Wait for a slot; :class:`QueueTimeout` when ``deadline`` passes first."""
        if self.free > 0 and not self._waiting:
            self.free -= 1
            self._note(owner)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(future)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout)
        except BaseException:  # this request was cancelled while it waited
            self._withdraw(owner, future)
            raise
        if not done:
            self._withdraw(owner, future)
            raise QueueTimeout()

    def leave(self) -> None:
        """A job is over: its slot goes to the next owner in turn."""
        while self._waiting:
            owner, queue = next(iter(self._waiting.items()))
            future = queue.popleft()
            del self._waiting[owner]
            if queue:
                self._waiting[owner] = queue  # to the back of the round
            if not future.done():
                future.set_result(None)
                self._note(owner)
                return
        self.free += 1

    def _withdraw(self, owner: str, future: asyncio.Future[None]) -> None:
        if future.done() and not future.cancelled():
            self.leave()  # it was let in at the last moment: pass the slot on
            return
        future.cancel()
        queue = self._waiting.get(owner)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self._waiting[owner]

    def _note(self, owner: str) -> None:
        self.granted.append(owner)
        del self.granted[:-1000]
