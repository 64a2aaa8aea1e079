"""One generation attempt: a task's run in its engine, from its first prompt to its
terminal write. The one place a turn of generation runs.

An :class:`Attempt` owns what a task's run has: its tokens (a resumed task's from its
snapshot first), its assembler (which turns the text into items and events), the events
not logged yet, what the task has consumed, and their writes:

- a turn (:meth:`Attempt.generate`) gives the prompt to the engine, feeds each piece to
  the assembler and checks after each one whether a cancel reached the task or the
  service is shutting down (:class:`Stopped`), a stop sequence ended the answer or the
  turn's budget (:meth:`Attempt.room`) is spent;
- the events are logged in batches (:meth:`Attempt.flush`): the first text is handed to
  the group-commit writer at once, then a batch on each tick of a flush clock shared by
  every task (every ``flush_interval`` seconds, so the batches of the tasks in flight
  reach the writer together) while the engine goes on. Until the next one is due the
  generation keeps the engine's pieces (:meth:`lmsp.engines.base.Generation.pace`): the
  runner's thread wakes a batch, not a token, unless a stop sequence is looked for. Each
  run of deltas of one item is joined into one event
  (:func:`lmsp.protocol.events.coalesce`), each batch goes with the snapshot that covers
  it (the tokens, the seed, the text held back, the prompt tokens given so far, and what
  the caller adds: the MCP loop's turn). A batch the writer has not begun when the next
  write is due (the next batch, or the terminal write) is taken back and joined to it:
  one writer job, the same events. Every write is guarded: once a cancel won, none
  lands, and the attempt stops;
- :meth:`Attempt.conclude` ends it: on :class:`lmsp.engines.base.EngineCrashed` the
  pieces that came before are logged and the crash goes on to the runner (the task's
  ``on_restart`` policy); at shutdown what it has is logged and the task left as it is,
  for recovery; a cancelled task is ``cancelled``; else the rest of the events and the
  terminal state commit together. However it ends, the task is charged
  :meth:`Attempt.usage`.

A plain response is one attempt of one turn (:mod:`lmsp.runner.runner`); the MCP loop
(:mod:`lmsp.runner.mcp_loop`) is one attempt whose turns alternate with journaled calls.
An attempt knows its task only through :class:`TaskContext`, the small public context
the runner hands it, and its engine only through :class:`lmsp.engines.base.LoadedModel`:
another engine kind (a remote upstream) is another ``generate`` behind that seam.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lmsp.engines.base import EngineCrashed, Generation, LoadedModel, Sampling
from lmsp.metrics import Metrics
from lmsp.protocol import events as ev
from lmsp.protocol.assembler import Event, OutputAssembler, TextDelta
from lmsp.protocol.objects import usage_counts
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn

Job = Callable[[Conn], Any]
Usage = dict[str, int]
A = TypeVar("A", bound=OutputAssembler)
#: what ended a turn early: its token budget ran out
MAX_OUTPUT_TOKENS = "max_output_tokens"


def room(n_ctx: int, taken: int, limit: int | None, produced: int) -> int:
    """How many tokens a turn may add: what a context of ``n_ctx`` leaves after the
    ``taken`` tokens, and what is left of ``limit`` after the ``produced`` ones."""
    budget = n_ctx - taken
    return budget if limit is None else min(limit - produced, budget)


class Stopped(Exception):
    """The task was cancelled (a write of it found a cancel had won), or the service
    is shutting down."""


@dataclass(frozen=True)
class TaskContext:
    """A task in flight as its attempt sees it: what the runner lends it, all public."""

    id: str
    metrics: Metrics
    #: seconds between two batches of events (``LMSP_FLUSH_INTERVAL``)
    flush_interval: float
    #: hand ``job`` to the group-commit writer, preceded in its transaction by the
    #: checks that this node still holds the task and its client is not revoked
    write: Callable[[Job], concurrent.futures.Future[Any]]
    #: a terminal write: fenced, retried while the disk is full (``None`` at shutdown)
    durably: Callable[[Job], Any]
    #: a cancel of the task committed
    cancelled: Callable[[], bool]
    #: the service is shutting down: tasks in flight stop where they are
    shutting_down: Callable[[], bool]
    #: the task's generation went to its engine (cancellable, its prompt's progress
    #: shown), or ``None``: it ended
    live: Callable[[Generation | None], None]
    #: from now on, what the task has consumed is this count (charged however it ends)
    charge: Callable[[Callable[[], Usage]], None]

    def stopping(self) -> bool:
        return self.cancelled() or self.shutting_down()


@dataclass
class Attempt(Generic[A]):
    task: TaskContext
    model: LoadedModel
    sampling: Sampling
    assembler: A
    tokens: list[int] = field(default_factory=list)
    #: what each snapshot carries besides the attempt's own (the MCP loop's turn)
    marks: Callable[[], dict[str, Any]] = dict
    #: prompt tokens given to the engine, every turn's
    input_tokens: int = 0
    #: of them, read from a cache (the turns that ended)
    cached: int = 0
    pending: list[Event] = field(default_factory=list)
    inflight: concurrent.futures.Future[Any] | None = None
    #: the events of the batch ``inflight`` writes (taken back with it: :meth:`_take_back`)
    inflight_events: list[Event] = field(default_factory=list)
    #: when the last batch went to the writer (never: the first text goes at once)
    last_flush: float = -math.inf
    generation: Generation | None = None
    charged: bool = False

    # -- what it has -------------------------------------------------------------------------
    def usage(self) -> Usage:
        """What the task has consumed so far: the prompt tokens given to the engine and
        the tokens generated."""
        live = self.generation.cached_tokens if self.generation is not None else 0
        return usage_counts(self.input_tokens, len(self.tokens), self.cached + live)

    def charge(self) -> None:
        """Charge the task :meth:`usage` from now on, however it ends."""
        if not self.charged:
            self.task.charge(self.usage)
            self.charged = True

    def snapshot(self) -> dict[str, Any]:
        """What a resume continues from (written with the events it covers)."""
        return {
            "tokens": list(self.tokens),
            "seed": self.sampling.seed,
            "held": self.assembler.held,
            **self.marks(),
            "input_tokens": self.input_tokens,  # what a restart charges (snapshots.spent)
        }

    # -- writes ------------------------------------------------------------------------------
    def _submit(self) -> concurrent.futures.Future[Any]:
        self.inflight_events = self.pending
        batch = ev.coalesce(self.pending)  # one delta event per item since the last flush
        self.pending = []
        task_id, snap = self.task.id, self.snapshot()
        future = self.task.write(lambda c: task_store.append_output(c, task_id, batch, snap))
        self.last_flush = time.monotonic()
        return future

    def flush(self, wait: bool = False) -> None:
        """Log the pending events with the snapshot covering them (``wait``: committed
        when this returns — the journal's rule before an MCP call is sent).
        :class:`Stopped` if a write found the task no longer ``running`` (a cancel won)."""
        inflight, self.inflight = self.inflight, None
        if inflight is not None and not self._take_back(inflight) and not inflight.result():
            raise Stopped
        future = self._submit()
        if not wait:
            self.inflight = future
        elif not future.result():
            raise Stopped

    def _take_back(self, inflight: concurrent.futures.Future[Any]) -> bool:
        """Take the last batch back if the writer has not begun it (its future is
        cancelled: the writer drops it, nothing of it is written); its events go first
        in :attr:`pending`, so the next write logs them with what came since, under
        the snapshot covering both — one writer job instead of two, the same events
        in the same order. ``False``: it is written or being written."""
        if not inflight.cancel():
            return False
        self.pending = self.inflight_events + self.pending
        self.inflight_events = []
        return True

    # -- a turn ------------------------------------------------------------------------------
    def room(self, prompt: list[int], done: list[int], limit: int | None) -> int:
        """How many tokens a turn may add after ``prompt`` and the ``done`` tokens of it
        so far: what the context leaves, and what is left of the task's ``limit``
        (``max_output_tokens``, all turns together)."""
        return room(self.model.n_ctx, len(prompt) + len(done), limit, len(self.tokens))

    def generate(
        self, prompt: list[int], done: list[int], grammar: str | None, max_tokens: int
    ) -> str | None:
        """One turn: at most ``max_tokens`` tokens after ``prompt`` and ``done`` (the
        tokens of this turn a resumed task has). :data:`MAX_OUTPUT_TOKENS` if the budget
        ran out, ``None`` if the model ended (or a stop sequence did); :class:`Stopped`
        once a cancel reached the task or the service is shutting down."""
        task, metrics = self.task, self.task.metrics
        metrics.reading(task.id, len(prompt))
        if max_tokens <= 0:
            metrics.prompt(task.id, len(prompt))
            return MAX_OUTPUT_TOKENS
        generation = self.model.generate(
            prompt, done, self.sampling, grammar=grammar, max_tokens=max_tokens
        )
        self.generation = generation
        self.charge()  # the prompt is the engine's: charged from now on, however it ends
        task.live(generation)
        try:
            with contextlib.closing(generation):
                ended = self._pieces(generation, len(prompt), max_tokens)
        finally:
            self.cached += generation.cached_tokens
            self.generation = None
            task.live(None)
        if task.stopping():  # its iteration ended because it was cancelled or interrupted
            raise Stopped
        return ended

    def _pieces(self, generation: Generation, prompt: int, max_tokens: int) -> str | None:
        task, metrics = self.task, self.task.metrics
        produced = 0
        logprobs: list[dict[str, Any]] = []
        for piece in generation:
            if produced == 0:  # the prompt is in: how much of it was cached
                metrics.prompt(task.id, prompt, generation.cached_tokens)
            self.tokens.append(piece.token)
            produced += 1
            metrics.token(task.id)
            if piece.logprobs is not None:  # a token inside a character waits
                logprobs.append(piece.logprobs)
            if piece.text:
                self.pending += self.assembler.feed(TextDelta(piece.text, tuple(logprobs)))
                logprobs.clear()
            if task.stopping():
                raise Stopped
            if self.assembler.stopped:  # a stop sequence: the answer is complete
                return None
            if produced >= max_tokens:
                return MAX_OUTPUT_TOKENS
            if not generation.ready():  # what came is read: log it, or wait for more
                self._pace(generation)
        if produced == 0:
            metrics.prompt(task.id, prompt, generation.cached_tokens)
        return None

    def _pace(self, generation: Generation) -> None:
        """With every piece at hand read: a batch is due (the first text at once, then
        one on each tick of the flush clock, :meth:`_due`), or the generation may keep
        its next pieces until the next batch is due — unless a stop sequence may end
        the answer in them (it is looked for as each piece comes)."""
        if self.pending and time.monotonic() >= self._due():
            self.flush()
        if self.assembler.stop:
            return  # each piece as it comes
        generation.pace(self._due())

    def _due(self) -> float:
        """When the next batch is due: at once before the first text, then at the first
        tick of the flush clock after the last batch. The clock ticks every
        ``flush_interval`` on :func:`time.monotonic` (the same for every task), so the
        batches of all the tasks in flight reach the group-commit writer together."""
        interval = self.task.flush_interval
        if self.last_flush == -math.inf:
            return -math.inf
        return (math.floor(self.last_flush / interval) + 1) * interval

    # -- the end -----------------------------------------------------------------------------
    def conclude(
        self,
        run: Callable[[], str | None],
        also: Job | None = None,
        check: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        """Run the task's turns (``run`` returns why the output is incomplete, if it
        is) and end the attempt (see the module's docstring); ``also`` joins the
        transaction of its terminal write, ``check`` sees the finished output before it
        is written (and may refuse it by raising)."""
        stopped = False
        incomplete: str | None = None
        try:
            incomplete = run()
        except Stopped:
            stopped = True
        except EngineCrashed:
            self._crashed()  # what came before it is kept, then the runner's policy
            raise
        inflight, self.inflight = self.inflight, None
        if inflight is not None and not self._take_back(inflight) and not inflight.result():
            stopped = True  # the task left `running`: a cancel won
        if self.task.shutting_down() and not self.task.cancelled():
            if self.pending:  # shutting down: persist what we have, recovery decides the rest
                self._submit().result()
            return
        if stopped or self.task.cancelled():
            self._cancel(also)
            return
        self._finish(incomplete, also, check)

    def _crashed(self) -> None:
        inflight, self.inflight = self.inflight, None
        if inflight is not None:
            inflight.result()
        if self.pending and not self.task.cancelled():
            self._submit().result()  # guarded: nothing is written once a cancel won

    def _cancel(self, also: Job | None) -> None:
        """A cancel reached the task: ``cancelled``, charged its usage."""
        task_id = self.task.id
        usage = self.usage() if self.charged else None

        def cancel(conn: Conn) -> None:
            task_store.finish_cancel(conn, task_id, usage)
            if also is not None:
                also(conn)

        self.task.durably(cancel)

    def _finish(
        self,
        incomplete: str | None,
        also: Job | None,
        check: Callable[[list[dict[str, Any]]], None] | None,
    ) -> None:
        # the text not logged yet, then the closing events: logged with the end, in one
        # append, all of them or none (no snapshot: nothing resumes a finished task)
        last = ev.coalesce(self.pending)
        self.pending = []
        usage = self.usage()
        closing = last + self.assembler.finish("incomplete" if incomplete else "completed")
        output = self.assembler.items
        if check is not None:
            check(output)
        task_id = self.task.id
        done = task_store.Completion(closing, output, usage, incomplete)

        def finish(conn: Conn) -> None:
            task_store.settle(conn, task_id, done)
            if also is not None:
                also(conn)

        self.task.durably(finish)
