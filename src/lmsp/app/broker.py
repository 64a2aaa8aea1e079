"""Wakes waiting streams after commits (the log itself is always read from SQLite).

Two ways to wait: for the next commit, whatever it changed (:meth:`Broker.current`,
then :meth:`Broker.wait`), or until a value changes (:meth:`Broker.wait_change`: a
task's stamp, a table's version), which the broker checks itself after each commit, on
the event loop, so a waiter whose value did not move is not woken at all: with many
streams open, a commit wakes the streams of the tasks it changed, not every stream."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


class _Watch:
    """A waiter of :meth:`Broker.wait_change`."""

    __slots__ = ("future", "probe", "seen")

    def __init__(
        self, probe: Callable[[], object], seen: object, future: asyncio.Future[bool]
    ) -> None:
        self.probe, self.seen, self.future = probe, seen, future


class Broker:
    """A generation counter: ``notify`` may be called from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._pending = False
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()

    def notify(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        with self._lock:
            self._pending = False
        event, self._event = self._event, asyncio.Event()
        event.set()
        moved = [w for w in self._watches if w.probe() != w.seen]
        for watch in moved:
            self._watches.discard(watch)
            if not watch.future.done():
                watch.future.set_result(True)

    def current(self) -> asyncio.Event:
        """Take this before reading, then wait on it: no commit can slip in between."""
        return self._event

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> bool:
        """Until ``event`` is set, at most ``timeout`` seconds (``False`` then). Not
        ``asyncio.wait_for``: before Python 3.12 it drops a cancellation that comes as
        the event is set, and a waiter whose client left waited on to the task's end."""
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True

    async def wait_change(self, probe: Callable[[], object], seen: object, timeout: float) -> bool:
        """Until ``probe()`` (a cheap read: called on the event loop after every commit)
        is no longer ``seen``, at most ``timeout`` seconds; ``False`` on the timeout. A
        value that moved before the call returns at once."""
        if probe() != seen:
            return True
        future: asyncio.Future[bool] = self._loop.create_future()
        watch = _Watch(probe, seen, future)
        self._watches.add(watch)
        timer = self._loop.call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._watches.discard(watch)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
