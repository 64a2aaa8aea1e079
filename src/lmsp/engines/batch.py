"""Continuous batching: many sequences, one decode per step.

Each running task steps its own sequence from its runner thread (its sampler, its
constraint, its flushes), but the expensive part — running the model over the next
tokens — is shared: :class:`Batcher`'s step thread gathers the decode requests of every
sequence that is ready (waiting a moment for the other active sequences to hand in
their tokens), runs them as one batch, and hands each request its logits; a request
that arrives while a step runs joins the next one. A new task's prompt joins the same steps
in chunks (:data:`CHUNK` tokens a step), so it never stalls the sequences generating.

:class:`SequencePool` says which sequence of the context a new task takes: the free one
whose cached tokens share the longest prefix with the new prompt (prompt-prefix reuse),
else the least recently used. A finished task's tokens stay in its sequence until
another task needs the room, so the next turn of an agent loop evaluates only what is
new. Neither class knows llama.cpp: the engine supplies the decode function.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

#: tokens of one sequence in one step. llama.cpp's CPU kernels give bit-identical
#: results for a sequence fed 1 to 48 tokens a step, whatever else is in the batch, and
#: different ones from 64 on (measured; ``tests/engines/test_batched_real.py``). Keeping
#: every chunk at most this long is what makes a prompt evaluated in chunks, a resume
#: that re-evaluates a snapshot, a cached prefix and a batched step agree to the bit.
CHUNK = 32

#: the shortest cached prefix worth reusing: a chat template's first tokens save nothing
MIN_REUSE = 2 * CHUNK

Logits = npt.NDArray[np.float32]


@dataclass
class Request:
    """One sequence's tokens for the next step."""

    seq: int
    tokens: list[int]
    pos: int  # the position of tokens[0]
    logits: bool  # the last token's logits are wanted
    result: Logits | None = None
    error: BaseException | None = None
    done: bool = False


DecodeFn = Callable[[list[Request]], None]


class Batcher:
    """Runs the decode requests of several threads as one batch per step, always from
    the same thread: llama.cpp's CPU backend keeps a team of worker threads per calling
    thread, and steps led by changing threads left several teams spinning against each
    other on two cores (a 3x slowdown, measured)."""

    def __init__(self, decode: DecodeFn, *, max_tokens: int = 512, gather: float = 0.002):
        self._decode = decode
        self.max_tokens = max_tokens
        self.gather = gather  # how long a step waits for the other active sequences
        self._cond = threading.Condition()
        self._pending: list[Request] = []
        self._stepping = False
        self._exclusive = 0
        self._alone = threading.Lock()  # one exclusive section at a time
        self._closed = False
        self.active = 0  # sequences that will submit again soon
        self.steps = 0
        self.tokens = 0
        self._thread = threading.Thread(target=self._run, name="lmsp-step", daemon=True)
        self._thread.start()

    # -- sequences ---------------------------------------------------------------------
    @contextmanager
    def sequence(self) -> Iterator[None]:
        """While a sequence generates, a step waits a moment for its requests."""
        with self._cond:
            self.active += 1
        try:
            yield
        finally:
            with self._cond:
                self.active -= 1
                self._cond.notify_all()

    def decode(self, seq: int, tokens: list[int], pos: int, logits: bool) -> Logits | None:
        """Evaluate ``tokens`` of ``seq`` from ``pos`` in the next step; the last token's
        logits (a copy) when ``logits``."""
        assert 0 < len(tokens) <= CHUNK
        request = Request(seq, tokens, pos, logits)
        with self._cond:
            if self._closed:
                raise RuntimeError("the model is closed")
            self._pending.append(request)
            self._cond.notify_all()
            while not request.done:
                self._cond.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._pending or self._exclusive):
                    self._cond.wait()
                if self._closed:
                    for request in self._pending:
                        request.error, request.done = RuntimeError("the model is closed"), True
                    self._cond.notify_all()
                    return
                deadline = time.monotonic() + self.gather
                while len(self._pending) < self.active and not self._exclusive:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._exclusive:
                    continue
                step = self._step()
                size = sum(len(r.tokens) for r in step)
                self._stepping = True
            try:
                self._decode(step)
            except BaseException as exc:  # every request of the step fails with it
                for request in step:
                    request.error = exc
            with self._cond:
                self.steps += 1
                self.tokens += size
                for request in step:
                    request.done = True
                self._stepping = False
                self._cond.notify_all()

    def _step(self) -> list[Request]:
        """The next step's requests (with the lock held): a prompt chunk runs alone;
        single tokens of every sequence run together. (Mixing a chunk with other
        sequences' tokens changed the later tokens of a sequence in about half of the
        runs of a test, ``test_two_sequences_sharing_a_prefix_at_once_stay_exact``.)"""
        first = self._pending[0]
        if len(first.tokens) > 1:
            step = [first]
        else:
            step = [r for r in self._pending if len(r.tokens) == 1][: self.max_tokens]
        for request in step:
            self._pending.remove(request)
        return step

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Neither a step nor another exclusive section runs meanwhile (trimming,
        copying, saving or restoring a sequence's cache)."""
        with self._alone:
            with self._cond:
                self._exclusive += 1
                while self._stepping:
                    self._cond.wait()
            try:
                yield
            finally:
                with self._cond:
                    self._exclusive -= 1
                    self._cond.notify_all()

    def close(self) -> None:
        """Stop the step thread (requests still waiting fail)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(30)


@dataclass
class Slot:
    """One sequence of the context and the tokens its cache holds (positions 0…n-1)."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    used: float = 0.0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    left = np.asarray(a[:n], dtype=np.int64)
    right = np.asarray(b[:n], dtype=np.int64)
    differ = np.flatnonzero(left != right)
    return int(differ[0]) if len(differ) else n


@dataclass(frozen=True)
class Choice:
    """Where a new sequence starts: its slot, and how many of its prompt's tokens the
    slot already holds."""

    slot: Slot
    cached: int


class SequencePool:
    """Which sequence a new task takes. Eviction: a free sequence keeps its tokens until
    a task takes it; a task takes the free sequence sharing the longest prefix with its
    prompt, and among those sharing none the least recently used."""

    def __init__(self, sequences: int) -> None:
        self.slots = [Slot(seq) for seq in range(sequences)]
        self._lock = threading.Lock()

    def take(self, tokens: Sequence[int]) -> Choice:
        with self._lock:
            free = [slot for slot in self.slots if not slot.busy]
            if not free:
                raise RuntimeError("more sequences than the context holds")
            scored = [(common_prefix(slot.tokens, tokens), slot) for slot in free]
            best, slot = max(scored, key=lambda pair: (pair[0], -pair[1].used))
            if best < MIN_REUSE:
                best = 0
            if best == 0:
                slot = min(free, key=lambda s: s.used)
            slot.busy = True
            slot.used = time.monotonic()
            slot.tokens = []  # in flux until its task says what it holds (hold)
            return Choice(slot, best)

    def hold(self, slot: Slot, tokens: list[int]) -> None:
        """``tokens`` is the list of what the busy ``slot`` holds, kept up to date by
        its task as it goes."""
        with self._lock:
            slot.tokens = tokens

    def give_back(self, slot: Slot, tokens: list[int]) -> None:
        """A task is done with its sequence, whose cache now holds ``tokens``."""
        with self._lock:
            slot.tokens = tokens
            slot.busy = False
            slot.used = time.monotonic()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"seq": s.seq, "tokens": len(s.tokens), "busy": s.busy} for s in self.slots]
