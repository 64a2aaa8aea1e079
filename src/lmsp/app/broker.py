"""Wakes waiting streams after every commit (the log itself is always read from SQLite)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Broker:
    """A generation counter: ``notify`` may be called from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._pending = False
        self._lock = threading.Lock()

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

    def current(self) -> asyncio.Event:
        """Take this before reading, then wait on it: no commit can slip in between."""
        return self._event

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True
