"""The engine core: one scheduling loop that owns a loaded model and its sequences.

It runs in the engine process (:mod:`lmsp.engines.worker`), on one thread: each turn
it reads what the API process sent (:mod:`lmsp.engines.protocol`), admits submitted
sequences while the context has room, forms a step (:class:`~lmsp.engines.batch.
StepPolicy`), runs it through the model (one ``llama_decode``), samples every sequence
whose logits the step produced, and sends the step's tokens back in one frame (packed:
:func:`~lmsp.engines.protocol.pack`). There is no thread per sequence and no handoff
per step: llama.cpp's CPU backend keeps a team of worker threads per calling thread,
so one caller for every decode is also what keeps
those teams from fighting over the cores.

The model is a :class:`Backend` (llama.cpp's, or the deterministic test engine's): it
takes a sequence of its context for a new submission (reusing a cached prefix),
evaluates steps, picks each sequence's next token (sampling by ``(seed, position)``,
the grammar's mask) and gives the sequence back. The core keeps the bookkeeping every
backend shares: what each sequence's cache holds, what is left to evaluate, how many
tokens it produced, when it ends, and what to tell the API process.

Embedding requests (:class:`~lmsp.engines.protocol.Embed`) queue beside the sequences
and are served on the same thread, in another llama.cpp context (the backend's
``embed``): one decode of as many of a request's inputs as fit per turn (the requests
in turn, so a small one never waits for a large one to end), between generation steps,
never touching a generating sequence's cache. While sequences
generate, embedding batches take at most a share of the engine's time
(:class:`~lmsp.engines.share.EmbedShare`, ``LMSP_EMBED_SHARE``): a generating sequence
keeps its rate within a stated factor however much is queued to embed. A
:class:`~lmsp.engines.protocol.Cancel` of an embedding request (its HTTP client went
away) drops it between two batches, answered with ``Done(id, "cancelled")``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lmsp.engines.base import EngineError, Piece, Sampling
from lmsp.engines.batch import ExactSteps, Logits, Request, StepPolicy
from lmsp.engines.protocol import (
    CANCELLED,
    LENGTH,
    PROGRESS_INTERVAL,
    STOP,
    Cancel,
    Channel,
    Done,
    Embed,
    Embeddings,
    Error,
    FromEngine,
    Progress,
    Shutdown,
    Stats,
    StatsReply,
    Submit,
    Tokens,
    pack,
)
from lmsp.engines.share import EmbedShare

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("lmsp.engine")

#: how long an idle loop waits for a message before it checks its parent is alive
IDLE_WAIT = 0.5

#: the most tokens of embedding inputs one turn evaluates (a model pooled by its last
#: token; see :mod:`lmsp.engines.llama_embed`): a sequence arriving waits for no more. The
#: same whether or not sequences generate, so an input's vector never depends on them.
EMBED_CHUNK = 64


@dataclass(eq=False)
class Seq:
    """One submitted sequence, as the core tracks it."""

    id: int
    prompt: list[int]
    resume: list[int]
    sampling: Sampling
    grammar: str | None
    max_tokens: int | None
    context: list[int] = field(init=False)  # prompt + resume: what is evaluated first
    slot: int = -1  # the context's sequence it runs in (set by the backend)
    held: list[int] = field(default_factory=list)  # what that sequence's cache holds
    todo: list[int] = field(default_factory=list)  # still to evaluate, in order
    cached: int = 0  # prompt tokens that came from a cache
    produced: int = 0  # tokens generated (after ``resume``)
    turn: int = 0  # when its next tokens became ready: the step-forming order
    reported: bool = False  # ``cached`` was sent
    state: Any = None  # the backend's own
    began: float = 0.0  # when it was admitted: its prompt's reading began
    told: float = 0.0  # when its last :class:`Progress` was sent

    def __post_init__(self) -> None:
        self.context = self.prompt + self.resume

    @classmethod
    def of(cls, message: Submit) -> Seq:
        return cls(
            message.id,
            list(message.prompt),
            list(message.resume),
            message.sampling,
            message.grammar,
            message.max_tokens,
        )


@dataclass(eq=False)
class EmbedJob:
    """One embedding request: its inputs, and the vectors of those done so far."""

    id: int
    inputs: list[list[int]]
    vectors: list[npt.NDArray[np.float32]] = field(default_factory=list)
    done: int = 0  # inputs embedded
    yielded: int = 0  # turns it gave way to generating sequences


class Backend(Protocol):
    """A loaded model as the core drives it."""

    n_ctx: int  # one sequence's context
    sequences: int  # how many sequences the context holds at once
    max_step_tokens: int  # the most tokens one step may evaluate

    def open(self, seq: Seq) -> None:
        """Give ``seq`` a sequence of the context: set ``slot``, ``held`` (a cached
        prefix of ``context``, never all of it: the last token's logits are needed),
        ``cached`` and ``state``. Raise :class:`EngineError` to refuse it."""
        ...

    def decode(self, step: list[Request]) -> None:
        """Evaluate a step; set ``result`` of every request that wants logits."""
        ...

    def evaluated(self, seq: Seq) -> None:
        """``seq``'s tokens of the last step are in its cache (``held``)."""
        ...

    def pick(self, seq: Seq, logits: Logits) -> Piece | None:
        """The next token of ``seq`` from its logits, or ``None``: it ends here."""
        ...

    def release(self, seq: Seq, intact: bool) -> None:
        """``seq`` ended; its cache holds ``held`` (``intact``) or cannot be trusted."""
        ...

    def sent(self, seqs: list[Seq]) -> None:
        """A step's results are out: work kept off the tokens' way (saving caches) may
        run now, before the next step. ``seqs`` are the active sequences."""
        ...

    def figures(self) -> dict[str, Any]:
        """Counts for :class:`Stats` (JSON-able)."""
        ...

    def embed(
        self, inputs: list[list[int]], max_tokens: int | None = None
    ) -> npt.NDArray[np.float32]:
        """The L2-normalised vectors of the first of ``inputs`` (as many as one batch of
        the embedding context holds): one row each. With ``max_tokens`` (sequences are
        generating) a backend may evaluate only that many tokens of the first input and
        give no row until its last chunk (it keeps the rest of that input in hand: the
        next call with the same first input goes on with it). Raise
        :class:`EngineError` (``model_cannot_embed`` …) to fail the request."""
        ...

    def memory_bytes(self) -> int: ...

    def close(self) -> None: ...


class EngineCore:
    """The scheduling loop (see the module docstring). ``alive`` is asked when idle: a
    parent-death check, so an engine never outlives the API process."""

    def __init__(
        self,
        backend: Backend,
        channel: Channel,
        policy: StepPolicy | None = None,
        alive: Callable[[], bool] = lambda: True,
        share: EmbedShare | None = None,
    ) -> None:
        self.backend = backend
        self.channel = channel
        self.policy: StepPolicy = policy or ExactSteps()
        self.alive = alive
        self.active: dict[int, Seq] = {}
        self.waiting: deque[Seq] = deque()
        self.embeds: deque[EmbedJob] = deque()
        self.embedded = 0  # inputs embedded
        self.embeds_cancelled = 0  # embedding requests dropped by a Cancel
        self.share = share or EmbedShare()
        self.steps = 0
        self.tokens = 0
        self._outbox: list[FromEngine] = []
        self._turns = 0
        self._stop = False

    @property
    def stopped(self) -> bool:
        """It ended on a :class:`Shutdown` (not because the API process is gone)."""
        return self._stop

    def run(self) -> None:
        """Serve until :class:`Shutdown`, or until the API process is gone."""
        try:
            while not self._stop:
                idle = not self.active and not self.waiting and not self.embeds
                if not self._receive(wait=idle):
                    log.info("engine: the service is gone")
                    return
                self._admit()
                self._step()
                self._embed()
                sending = bool(self._outbox)
                if not self._send():
                    return
                if sending:
                    self._after_send()
        finally:
            for seq in list(self.active.values()):
                self._end(seq, intact=True)

    # -- messages ----------------------------------------------------------------------
    def _receive(self, wait: bool) -> bool:
        """Handle every message waiting (waiting a while for one when idle); ``False``
        when the API process is gone."""
        timeout = IDLE_WAIT if wait else 0.0
        try:
            while self.channel.poll(timeout):
                frame = self.channel.recv()
                for message in frame if isinstance(frame, list) else [frame]:
                    self._handle(message)
                timeout = 0.0
        except (EOFError, OSError):
            return False
        return not wait or self.alive()

    def _handle(self, message: Any) -> None:
        if isinstance(message, Submit):
            self.waiting.append(Seq.of(message))
        elif isinstance(message, Cancel):
            if self._cancel_embed(message.id):
                return
            seq = self.active.get(message.id)
            if seq is not None:
                self._end(seq, intact=True)
                self._outbox.append(Done(seq.id, CANCELLED))
                return
            for queued in self.waiting:
                if queued.id == message.id:
                    self.waiting.remove(queued)
                    self._outbox.append(Done(queued.id, CANCELLED))
                    return
        elif isinstance(message, Embed):
            self.embeds.append(EmbedJob(message.id, [list(i) for i in message.inputs]))
        elif isinstance(message, Stats):
            figures = {
                "steps": self.steps,
                "tokens": self.tokens,
                "active": len(self.active),
                "waiting": len(self.waiting),
                "embedded": self.embedded,
                "embeds_cancelled": self.embeds_cancelled,
                "embed_yields": self.share.yielded,
                **self.backend.figures(),
            }
            self._outbox.append(StatsReply(message.id, figures))
        elif isinstance(message, Shutdown):
            self._stop = True
        else:
            log.warning("engine: an unknown message %s was ignored", type(message).__name__)

    def _send(self) -> bool:
        if not self._outbox:
            return True
        messages, self._outbox = self._outbox, []
        try:
            self.channel.send(pack(messages))
        except (OSError, ValueError):
            log.info("engine: the service is gone")
            return False
        return True

    def _after_send(self) -> None:
        try:
            self.backend.sent(list(self.active.values()))
        except Exception:  # saving a prefix is an optimisation: never fatal
            log.exception("engine: after-send work failed")

    # -- sequences ---------------------------------------------------------------------
    def _admit(self) -> None:
        """Open waiting sequences while the context has a free sequence."""
        while self.waiting and len(self.active) < self.backend.sequences:
            seq = self.waiting.popleft()
            try:
                self.backend.open(seq)
            except EngineError as exc:
                self._outbox.append(Error(seq.id, exc.code, exc.message))
                continue
            except Exception as exc:
                log.exception("engine: a sequence could not start")
                self._outbox.append(Error(seq.id, "engine_error", _failed(exc)))
                continue
            seq.todo = seq.context[len(seq.held) :]
            seq.turn = self._next_turn()
            seq.began = seq.told = time.monotonic()
            self.active[seq.id] = seq
            if not seq.todo:  # the last token's logits are needed: a backend's mistake
                self._fail(seq, "engine_error", "The engine had nothing to evaluate.")

    def _next_turn(self) -> int:
        self._turns += 1
        return self._turns

    def _end(self, seq: Seq, intact: bool) -> None:
        self.active.pop(seq.id, None)
        try:
            self.backend.release(seq, intact)
        except Exception:
            log.exception("engine: a sequence could not be given back")

    def _finish(self, seq: Seq, reason: str) -> None:
        self._report(seq, [])
        self._end(seq, intact=True)
        self._outbox.append(Done(seq.id, reason))

    def _fail(self, seq: Seq, code: str, message: str) -> None:
        self._end(seq, intact=False)
        self._outbox.append(Error(seq.id, code, message))

    def _report(self, seq: Seq, pieces: list[Piece]) -> None:
        """Pieces for the API process; the first report carries ``cached``."""
        if seq.reported and not pieces:
            return
        cached = None if seq.reported else seq.cached
        seq.reported = True
        self._outbox.append(Tokens(seq.id, pieces, cached))

    # -- one step ----------------------------------------------------------------------
    def _step(self) -> None:
        ready = sorted((s for s in self.active.values() if s.todo), key=lambda s: s.turn)
        if not ready:
            return
        chosen = self.policy.form([len(s.todo) for s in ready], self.backend.max_step_tokens)
        step = [(ready[i], n) for i, n in chosen]
        requests = [
            Request(seq.slot, seq.todo[:n], len(seq.held), n == len(seq.todo)) for seq, n in step
        ]
        began = time.monotonic()
        try:
            self.backend.decode(requests)
        except EngineError as exc:
            for seq, _ in step:
                self._fail(seq, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("engine: a step failed")
            for seq, _ in step:
                self._fail(seq, "engine_error", _failed(exc))
            return
        self.share.stepped(time.monotonic() - began)
        self.steps += 1
        self.tokens += sum(n for _, n in step)
        for (seq, n), request in zip(step, requests, strict=True):
            seq.held.extend(seq.todo[:n])
            del seq.todo[:n]
            seq.turn = self._next_turn()
            try:
                self.backend.evaluated(seq)
            except Exception:  # saving a prefix is an optimisation: never fatal
                log.exception("engine: after-step work of a sequence failed")
            if request.logits and request.result is not None:
                self._next_token(seq, request.result)
        self._progress([seq for seq, _ in step])

    def _progress(self, stepped: list[Seq]) -> None:
        """Say how far the prompts still being read are, at most every
        :data:`PROGRESS_INTERVAL` a sequence (a prompt read in less says nothing)."""
        now = time.monotonic()
        for seq in stepped:
            reading = seq.produced == 0 and len(seq.todo) > 0 and seq.id in self.active
            if reading and now - seq.told >= PROGRESS_INTERVAL:
                seq.told = now
                read, total = len(seq.held), len(seq.context)
                self._outbox.append(Progress(seq.id, read, total, seq.cached, now - seq.began))

    def _next_token(self, seq: Seq, logits: Logits) -> None:
        n_ctx = self.backend.n_ctx
        if len(seq.held) >= n_ctx:
            self._finish(seq, LENGTH)
            return
        try:
            piece = self.backend.pick(seq, logits)
        except EngineError as exc:
            self._report(seq, [])
            self._fail(seq, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("engine: sampling failed")
            self._report(seq, [])
            self._fail(seq, "engine_error", _failed(exc))
            return
        if piece is None:
            self._finish(seq, STOP)
            return
        seq.produced += 1
        self._report(seq, [piece])
        limit = seq.max_tokens
        if (limit is not None and seq.produced >= limit) or len(seq.held) + 1 > n_ctx:
            self._finish(seq, LENGTH)  # no room, or no need, for the token just drawn
            return
        seq.todo = [piece.token]

    # -- embeddings ----------------------------------------------------------------------
    def _cancel_embed(self, job_id: int) -> bool:
        """Drop a queued embedding request (its client went away); ``False`` when no
        such request is queued here (it is a sequence's id, or it ended already)."""
        for job in self.embeds:
            if job.id == job_id:
                self.embeds.remove(job)
                self.embeds_cancelled += 1
                log.info(
                    "engine: embedding request %d cancelled after %d of %d inputs",
                    job.id,
                    job.done,
                    len(job.inputs),
                    extra={"event": "embedding.cancelled"},
                )
                self._outbox.append(Done(job.id, CANCELLED))
                return True
        return False

    def _embed(self) -> None:
        """One embedding batch of the request whose turn it is, when the share of the
        engine's time embeddings may take allows it (see the module docstring)."""
        import numpy as np

        if not self.embeds:
            return
        job = self.embeds[0]
        generating = bool(self.active or self.waiting)
        if not self.share.may_embed(generating):
            job.yielded += 1
            return
        began = time.monotonic()
        try:
            vectors = self.backend.embed(job.inputs[job.done :], EMBED_CHUNK)
        except EngineError as exc:
            self.embeds.popleft()
            self._outbox.append(Error(job.id, exc.code, exc.message))
            return
        except Exception as exc:
            log.exception("engine: embedding failed")
            self.embeds.popleft()
            self._outbox.append(Error(job.id, "engine_error", _failed(exc)))
            return
        self.share.embedded(time.monotonic() - began, generating)
        job.vectors.append(vectors)
        job.done += len(vectors)
        self.embedded += len(vectors)
        if job.done < len(job.inputs):
            if len(vectors):  # no input of it in hand: the requests take turns
                self.embeds.rotate(-1)  # (a small one never waits for a big one)
            return
        self.embeds.popleft()
        rows = np.concatenate(job.vectors)[: len(job.inputs)]
        out = rows.astype(np.float32, copy=False)
        self._outbox.append(Embeddings(job.id, out, job.yielded))


def _failed(exc: BaseException) -> str:
    return f"The engine failed: {type(exc).__name__}."
