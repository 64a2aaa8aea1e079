"""One sequence's pieces in the API process, as the engine client's reader thread routes
them (:class:`Stream`): an iterator for the attempt that runs the sequence, woken for a
batch of tokens when the attempt's pace says it is due, and ended with the engine's
error, or its crash, after every piece that came before."""

from __future__ import annotations

import contextlib
import math
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from lmsp.engines.base import EngineCrashed, EngineError, Generation, Piece, PromptProgress
from lmsp.engines.protocol import Done, Error, Progress, Tokens


class Owner(Protocol):
    """The engine client a stream belongs to: what its sequence's end asks of it."""

    def cancel(self, sid: int) -> None: ...

    def forget(self, sid: int) -> None: ...


class Interrupted:
    """A stream ended on this side (the service is shutting down)."""


class Crashed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


Item = Tokens | Done | Error | Crashed | Interrupted


class Stream(Generation):
    """One sequence's pieces as they arrive. Iterating raises :class:`EngineError` when
    the engine failed the sequence and :class:`EngineCrashed` when the engine died, in
    both cases after the pieces that came before.

    The reader thread appends what comes to the stream's list and wakes its consumer
    only when the consumer waits for it: for a step's tokens only once the time the
    consumer gave to :meth:`pace` has come (until then they are kept, and taken all at
    once), for the end of the sequence at once."""

    def __init__(self, client: Owner, sid: int) -> None:
        super().__init__()
        self.id = sid
        self._client = client
        self._items: deque[Item] = deque()
        self._signal: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._waiting = False  # the consumer waits (or is about to)
        self._patient = False  # ... and needs no tokens before ``_until``
        self._until = -math.inf
        self._ready_pieces: deque[Piece] = deque()
        self._ended = False
        self.progress: PromptProgress | None = None  # the engine's last word on its prompt
        self._watcher: Callable[[PromptProgress], None] | None = None

    def put(self, item: Item) -> None:
        """(The reader thread, or an interrupt.) Append ``item``; wake the consumer if
        it waits for it."""
        self._items.append(item)
        if self._waiting and not (self._patient and isinstance(item, Tokens)):
            self._signal.put(None)

    def pace(self, until: float) -> None:
        self._until = until

    def ready(self) -> int:
        return len(self._ready_pieces)

    def watch(self, callback: Callable[[PromptProgress], None]) -> None:
        self._watcher = callback
        if self.progress is not None:  # it came before the watcher
            callback(self.progress)

    def progressed(self, message: Progress) -> None:
        """(The reader thread.) The engine said how far its prompt is read."""
        self.progress = PromptProgress(message.read, message.total, message.cached, message.seconds)
        watcher = self._watcher
        if watcher is not None:
            watcher(self.progress)

    def _take(self) -> Item:
        """The next item, once the consumer needs it: the end of the sequence (and the
        tokens before it) at once; tokens once the paced time has come."""
        items = self._items
        while True:
            wait = self._until - time.monotonic()
            if items and (wait <= 0 or not isinstance(items[-1], Tokens)):
                return items.popleft()
            self._patient = wait > 0
            self._waiting = True  # announced before the look below: no wake is lost
            if not items or (self._patient and isinstance(items[-1], Tokens)):
                with contextlib.suppress(queue.Empty):
                    self._signal.get(timeout=wait if self._patient else None)
            self._waiting = False

    def __next__(self) -> Piece:
        while not self._ready_pieces:
            if self._ended:
                raise StopIteration
            item = self._take()
            if isinstance(item, Tokens):
                self._add(item)
                while self._items and isinstance(following := self._items[0], Tokens):
                    self._items.popleft()
                    self._add(following)  # all that came, at once
                continue
            self._ended = True
            if isinstance(item, Error) and item.code == "engine_crashed":
                raise EngineCrashed(item.message)  # a remote engine's upstream broke off
            if isinstance(item, Error):
                raise EngineError(item.code, item.message)
            if isinstance(item, Crashed):
                raise EngineCrashed(item.reason)
        return self._ready_pieces.popleft()

    def _add(self, tokens: Tokens) -> None:
        if tokens.cached_tokens is not None:
            self.cached_tokens = tokens.cached_tokens
        self._ready_pieces.extend(tokens.pieces)

    def cancel(self) -> None:
        """Ask the engine to stop this sequence: it frees it and says it is done (the
        pieces it sent before still come first)."""
        self._client.cancel(self.id)

    def interrupt(self) -> None:
        """End the iteration on this side now (and free the engine's sequence)."""
        self.put(Interrupted())
        self._client.cancel(self.id)

    def close(self) -> None:
        """Done with it: an unfinished sequence is cancelled in the engine."""
        self._client.forget(self.id)
