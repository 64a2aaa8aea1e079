"""The API process's end of one engine: start it, submit sequences, read what comes back.

:class:`EngineClient` spawns the engine process (:func:`lmsp.engines.worker.
process_main`, with :mod:`multiprocessing`'s *spawn* start method: a fresh interpreter
that inherits no thread, lock or open database of the API process) and keeps one
channel to it (:mod:`lmsp.engines.protocol`). Callers get a :class:`Stream` per
sequence: an iterator of pieces, fed by the client's one reader thread, which routes
every frame the engine sends to its streams (a step's tokens decoded once, in C:
:class:`~lmsp.engines.protocol.Step`).

:meth:`EngineClient.attach` connects instead to an engine an earlier API process
started and left running (:mod:`lmsp.engines.reattach`): not a child of this process, it
is watched by its process id.

When the engine dies (a segfault, ``kill -9``, the kernel's out-of-memory killer) the
channel closes: the reader thread marks the client dead, tells its owner
(``on_exit``: the model host, which restarts the engine) and then ends every open
stream with :class:`~lmsp.engines.base.EngineCrashed` after the pieces already
received — so a task keeps every token the engine produced before it died, and its
``on_restart`` policy decides the rest.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Client
from typing import TYPE_CHECKING, Any

from lmsp.engines.base import (
    EngineCrashed,
    EngineError,
    Sampling,
    Tokenizer,
)
from lmsp.engines.early import Early, Inputs
from lmsp.engines.protocol import (
    Cancel,
    Done,
    Embed,
    Embeddings,
    Error,
    Progress,
    Ready,
    Shutdown,
    Stats,
    StatsReply,
    Step,
    Submit,
    ToEngine,
    Tokens,
)
from lmsp.engines.stream import Crashed, Stream
from lmsp.engines.worker import EngineSpec, process_main, serve

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from lmsp.engines.ahead import Ahead

#: the exit status of a remote engine whose upstream broke off (lmsp.engines.remote)
UPSTREAM_LOST = 75

log = logging.getLogger("lmsp")

#: the longest a model may take to load before its engine is given up
LOAD_TIMEOUT = 600.0


class EmbedCall:
    """One embedding request in flight: its ``future`` (the vectors), and
    :meth:`cancel` to drop it in the engine (its HTTP client went away)."""

    def __init__(self, client: EngineClient, sid: int, future: Future[npt.NDArray[np.float32]]):
        self.id = sid
        self.future = future
        self.yielded = 0  # turns the engine gave way to generation (set with the vectors)
        self._client = client

    def cancel(self) -> None:
        """Stop the engine's work on it (between two batches): the future is cancelled
        and the engine answers ``Done(id, "cancelled")`` (counted in
        :attr:`EngineClient.embeds_cancelled`)."""
        self._client.cancel_embed(self)


class ChannelBroken(EngineCrashed):
    """A message could not be sent: the engine's end of the channel is closed (it is
    exiting or gone; its reader learns why from its exit)."""


class EngineClient:
    """One engine (see the module docstring). ``in_thread``: run it on a thread of this
    process instead (tests of the test engine); ``on_exit`` is called, from the reader
    thread, with the client and a description when the engine ends unasked."""

    def __init__(
        self,
        spec: EngineSpec,
        tokenizer: Tokenizer | None = None,
        *,
        in_thread: bool = False,
        on_exit: Callable[[EngineClient, str], None] | None = None,
        ahead: Ahead | None = None,
    ) -> None:
        self.spec = spec
        self.ahead = ahead  # a process started ahead, taken to launch and refilled once up
        self.tokenizer = tokenizer
        self.in_thread = in_thread
        self.on_exit = on_exit
        self.pid: int | None = None
        self.n_ctx = 0
        self.sequences = 0
        self.memory = 0
        self.exit_reason: str | None = None
        self._conn: Any = None
        self._runner: multiprocessing.process.BaseProcess | threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._streams: dict[int, Stream] = {}
        self._stats: dict[int, Future[dict[str, Any]]] = {}
        self._embeds: dict[int, EmbedCall] = {}
        self._cancelling: set[int] = set()  # embedding requests this side cancelled
        self.embeds_cancelled = 0  # … whose cancellation the engine confirmed
        self._lock = threading.Lock()  # streams, stats, embeddings and sends
        self._ready = threading.Event()
        self._load_error: EngineError | None = None
        self._closing = False
        self._dead = False
        #: it said it is going (a remote engine whose upstream broke off tells each open
        #: sequence ``engine_crashed`` before it exits): no new work, its exit follows
        self._going = False
        self._attached: int | None = None  # the pid of an engine this process did not start
        self.released: Callable[[], None] | None = None  # its lease ends (reattach.Registry)
        self.early: Early[Stream] = Early()  # generations begun before their task's commit

    # -- life --------------------------------------------------------------------------
    def start(self, timeout: float = LOAD_TIMEOUT) -> EngineClient:
        """Start the engine and wait until its model is loaded. Raises
        :class:`EngineError` (``model_load_failed`` …) if it cannot load, and
        :class:`EngineCrashed` if it died meanwhile."""
        self.launch()
        return self.wait(timeout)

    def launch(self) -> None:
        """Start the engine without waiting for it (:meth:`wait` does)."""
        ctx = multiprocessing.get_context("spawn")
        ahead = None if self.in_thread or self.ahead is None else self.ahead.launch(self.spec)
        if ahead is not None:  # started ahead, its imports done: it was told what to be
            self._runner, self._conn = ahead
            self.pid = ahead[0].pid
        elif self.in_thread:
            self._conn, there = ctx.Pipe(duplex=True)
            self._runner = threading.Thread(
                target=serve, args=(there, self.spec), name="lmsp-engine", daemon=True
            )
            self._runner.start()
        else:
            self._conn, there = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=process_main,
                args=(there, self.spec, os.getpid()),
                name=f"lmsp-engine {self.spec.model}",
                daemon=True,
            )
            process.start()
            there.close()  # the engine's end lives in the engine only: its death closes ours
            self._runner = process
            self.pid = process.pid
        self._reader = threading.Thread(target=self._read, name="lmsp-engine-read", daemon=True)
        self._reader.start()

    def attach(self, pid: int, timeout: float) -> EngineClient:
        """Connect to the running engine ``pid`` on ``spec.address`` (an earlier API
        process started it) and wait until it says it is ready, with that pid. Raises
        :class:`OSError` or :class:`multiprocessing.AuthenticationError` when it cannot
        be reached or does not know the key, and as :meth:`wait`."""
        self._conn = Client(self.spec.address, family="AF_UNIX", authkey=self.spec.authkey)
        self._attached = self.pid = pid
        self._reader = threading.Thread(target=self._read, name="lmsp-engine-read", daemon=True)
        self._reader.start()
        self.wait(timeout)
        if self.pid != pid:
            self._attached = self.pid  # the process that answered is the one to stop
            raise EngineCrashed(f"Another process ({self.pid}) answered for engine {pid}.")
        return self

    def wait(self, timeout: float = LOAD_TIMEOUT) -> EngineClient:
        """Wait until the launched engine's model is loaded (raises as :meth:`start`)."""
        if not self._ready.wait(timeout):
            self._stop_runner()
            raise EngineError("model_load_failed", f"The model did not load in {timeout:.0f} s.")
        if self._load_error is not None:
            self._stop_runner()
            raise self._load_error
        if self._dead:
            raise EngineCrashed(f"The engine stopped while loading the model: {self.exit_reason}.")
        if self.ahead is not None and not self.in_thread:
            # the next engine to start at this priority finds a process waiting
            self.ahead.refill(self.spec.options.nice)
        return self

    @property
    def alive(self) -> bool:
        return self._ready.is_set() and not (self._dead or self._going or self._closing)

    def stopping(self) -> None:
        """It is being stopped on purpose: its end is no crash."""
        self._closing = True

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine: it drops its sequences, finishes writing saved prefixes and
        exits (killed if it has not within ``timeout``)."""
        self._closing = True
        with contextlib.suppress(EngineError):  # gone already: nothing to tell it
            self._send(Shutdown())
        self._stop_runner(timeout)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        self._release()

    def _release(self) -> None:
        released, self.released = self.released, None
        if released is not None:
            try:
                released()
            except Exception:  # pragma: no cover - a lease file that cannot be removed
                log.exception("the engine's lease of %s was not removed", self.spec.model)

    def _stop_runner(self, timeout: float = 0.0) -> None:
        if self._attached is not None:
            if not _gone(self._attached, timeout):
                with contextlib.suppress(OSError):
                    os.kill(self._attached, signal.SIGKILL)
            return
        runner = self._runner
        if isinstance(runner, threading.Thread):
            runner.join(timeout)
            return
        if runner is None:
            return
        runner.join(timeout)
        if runner.exitcode is None:
            runner.kill()
            runner.join(10)

    # -- sequences ---------------------------------------------------------------------
    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if self.tokenizer is None:
            raise EngineError("engine_error", "This engine has no tokenizer here.")
        if tools:
            return self.tokenizer.prompt_tokens(messages, tools)
        return self.tokenizer.prompt_tokens(messages)

    def generate(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        grammar: str | None = None,
        max_tokens: int | None = None,
    ) -> Stream:
        """Start a sequence: tokens after ``prompt + resume`` (see
        :class:`~lmsp.engines.protocol.Submit`); the one begun early for exactly these
        inputs (:meth:`begin_early`), if any."""
        if self.early:
            inputs = Inputs(tuple(prompt), tuple(resume), sampling, grammar, max_tokens)
            adopted = self.early.adopt(inputs)
            if adopted is not None:
                return adopted
        return self._start(prompt, resume, sampling, grammar, max_tokens)

    def begin_early(
        self, prompt: list[int], sampling: Sampling, grammar: str | None, max_tokens: int
    ) -> Callable[[], bool] | None:
        """Start a fresh sequence now, for the attempt that will ask :meth:`generate`
        for the same inputs (:mod:`lmsp.engines.early`): what drops it if none does
        (``True``: it was closed unadopted), or ``None`` when one with these inputs is
        begun already."""
        inputs = Inputs(tuple(prompt), (), sampling, grammar, max_tokens)
        stream = self._start(prompt, [], sampling, grammar, max_tokens)
        if not self.early.hold(inputs, stream):
            stream.close()
            return None
        return lambda: self.early.drop(inputs, stream)

    def _start(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        grammar: str | None,
        max_tokens: int | None,
    ) -> Stream:
        if len(prompt) + len(resume) >= self.n_ctx:
            raise EngineError("context_length_exceeded", "The conversation fills the context.")
        sid = next(self._ids)
        stream = Stream(self, sid)
        with self._lock:
            if self._dead:
                raise EngineCrashed(self._crash_message())
            self._streams[sid] = stream
        try:
            self._send(Submit(sid, list(prompt), list(resume), sampling, grammar, max_tokens))
        except ChannelBroken:
            pass  # it is exiting: its reader ends this stream saying why (:meth:`_ended`)
        except EngineError:
            with self._lock:
                self._streams.pop(sid, None)
            raise
        return stream

    def cancel(self, sid: int) -> None:
        """Stop a sequence in the engine (nothing if it ended already)."""
        with contextlib.suppress(EngineError):  # the engine is gone: nothing to stop
            self._send(Cancel(sid))

    def forget(self, sid: int) -> None:
        with self._lock:
            stream = self._streams.pop(sid, None)
        if stream is not None:
            self.cancel(sid)

    def stats(self, timeout: float = 30.0) -> dict[str, Any]:
        """The engine's figures (:class:`~lmsp.engines.protocol.Stats`)."""
        future: Future[dict[str, Any]] = Future()
        sid = next(self._ids)
        with self._lock:
            self._stats[sid] = future
        self._send(Stats(sid))
        return future.result(timeout)

    def embed(self, inputs: list[list[int]]) -> npt.NDArray[np.float32]:
        """One L2-normalised vector per input (lists of tokens), computed in the
        engine's embedding context (:class:`~lmsp.engines.protocol.Embed`). Raises
        :class:`EngineError` (``model_cannot_embed`` …) and :class:`EngineCrashed`."""
        return self.embed_later(inputs).future.result()

    def embed_later(self, inputs: list[list[int]]) -> EmbedCall:
        """:meth:`embed` without waiting: the call, whose future gets its vectors (an
        event loop awaits it without holding a thread) and which can be cancelled."""
        future: Future[npt.NDArray[np.float32]] = Future()
        call = EmbedCall(self, next(self._ids), future)
        with self._lock:
            if self._dead:
                raise EngineCrashed(self._crash_message())
            self._embeds[call.id] = call
        try:
            self._send(Embed(call.id, [list(i) for i in inputs]))
        except EngineError:
            with self._lock:
                self._embeds.pop(call.id, None)
            raise
        return call

    def cancel_embed(self, call: EmbedCall) -> None:
        """See :meth:`EmbedCall.cancel`; nothing if it has its answer already."""
        with self._lock:
            if self._embeds.pop(call.id, None) is None:
                return
            self._cancelling.add(call.id)
        call.future.cancel()
        self.cancel(call.id)

    def _send(self, message: ToEngine) -> None:
        with self._lock:
            if self._dead or self._conn is None:
                raise EngineCrashed(self._crash_message())
            try:
                self._conn.send([message])
            except (OSError, ValueError) as exc:
                raise ChannelBroken(f"The engine cannot be reached: {exc}.") from exc

    # -- what comes back ---------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                frame = self._conn.recv()
                for message in frame:
                    if isinstance(message, Step):
                        self._route(message)
                    else:
                        self._dispatch(message)
        except (EOFError, OSError):
            pass
        except Exception:  # pragma: no cover - a bug: treat it as the engine lost
            log.exception("reading from the engine of %s failed", self.spec.model)
        self._ended()

    def _route(self, step: Step) -> None:
        """A step's tokens, decoded once, each sequence's handed to its stream (one
        look-up under the lock for them all)."""
        tokens = step.tokens()
        with self._lock:
            streams = self._streams
            routed = [(streams.get(t.id), t) for t in tokens]
        for stream, message in routed:
            if stream is not None:
                stream.put(message)

    def _dispatch(self, message: Any) -> None:
        if isinstance(message, Embeddings | Error | Done) and message.id in self._cancelling:
            with self._lock:
                self._cancelling.discard(message.id)
                if isinstance(message, Done):
                    self.embeds_cancelled += 1  # the engine dropped it
        elif isinstance(message, Embeddings | Error) and message.id in self._embeds:
            with self._lock:
                waiting = self._embeds.pop(message.id, None)
            if waiting is None:
                return
            if isinstance(message, Embeddings):
                waiting.yielded = message.yielded
                waiting.future.set_result(message.vectors)
            else:
                waiting.future.set_exception(EngineError(message.code, message.message))
        elif isinstance(message, Tokens | Done | Error) and message.id is not None:
            if isinstance(message, Error) and message.code == "engine_crashed":
                self._going = True  # the task the host hands out next waits for the restart
            with self._lock:
                if isinstance(message, Tokens):
                    stream = self._streams.get(message.id)
                else:
                    stream = self._streams.pop(message.id, None)
            if stream is not None:
                stream.put(message)
        elif isinstance(message, Progress):
            with self._lock:
                stream = self._streams.get(message.id)
            if stream is not None:
                stream.progressed(message)
        elif isinstance(message, StatsReply):
            with self._lock:
                future = self._stats.pop(message.id, None)
            if future is not None:
                future.set_result(message.figures)
        elif isinstance(message, Ready):
            self.pid, self.n_ctx = message.pid, message.n_ctx
            self.sequences, self.memory = message.sequences, message.memory_bytes
            self._ready.set()
        elif isinstance(message, Error):  # the model did not load
            self._load_error = EngineError(message.code, message.message)
            self._ready.set()

    def _ended(self) -> None:
        """The channel closed: the engine exited, was stopped, or died."""
        self.exit_reason = self._describe_exit()
        if not self._closing:
            self._release()  # it died: the next API process must not look for it
        with self._lock:
            self._dead = True
            streams = list(self._streams.values())
            self._streams.clear()
            futures: list[Future[Any]] = [*self._stats.values()]
            futures += [call.future for call in self._embeds.values()]
            self._stats.clear()
            self._embeds.clear()
            self._conn.close()
        unasked = not self._closing and self._load_error is None
        if unasked and self._ready.is_set():
            log.error(
                "the engine of %s (pid %s) stopped: %s",
                self.spec.model,
                self.pid,
                self.exit_reason,
                extra={"event": "engine.crashed", "model": self.spec.model},
            )
        if unasked and self.on_exit is not None:
            try:
                self.on_exit(self, self.exit_reason)  # first: the host forgets this engine
            except Exception:  # pragma: no cover - a bug in the owner
                log.exception("the engine's exit was not handled")
        message = self._crash_message()
        for stream in streams:
            stream.put(Crashed(message))
        for future in futures:
            future.set_exception(EngineCrashed(message))
        self._ready.set()

    def _describe_exit(self) -> str:
        if self._attached is not None:  # no exit status: an earlier process started it
            if _gone(self._attached, 2.0):
                return "it exited"
            with contextlib.suppress(OSError):
                os.kill(self._attached, signal.SIGKILL)
            return "it closed its channel and was killed"
        runner = self._runner
        if isinstance(runner, threading.Thread) or runner is None:
            return "its thread ended"
        runner.join(2.0)
        if runner.exitcode is None:  # its channel closed but it lives on: of no use
            runner.kill()
            runner.join(10)
            return "it closed its channel and was killed"
        code = runner.exitcode
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        if code == UPSTREAM_LOST:  # named as the sequences it told were (remote._lost)
            remote = self.spec.options.remote or {}
            urls = [remote.get("url", ""), *remote.get("replicas", ())]
            named = " or ".join(u for u in urls if u)
            return f"its upstream {named} broke off" if named else "its upstream broke off"
        return f"exited with status {code}"

    def _crash_message(self) -> str:
        return (
            f"The engine process of {self.spec.model!r} stopped unexpectedly "
            f"({self.exit_reason or 'it is gone'})."
        )


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (not a child of this one) ended within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return True  # the id was taken by another user's process: ours is gone
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
