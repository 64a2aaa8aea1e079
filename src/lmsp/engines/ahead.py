"""An engine process started ahead: an interpreter with the engine's imports done,
waiting for the spec of the engine it is to become.

Why: an engine's start is a new interpreter and its imports (llama.cpp's bindings,
numpy, the engine's own modules: ~0.2 s on this project's two cores) before its model
and KV cache (~0.4 s for the bundled model). A restart after a crash, a model's first
load and a swap all paid it, and a task resumed after its engine crashed waited for it.

:class:`Ahead` keeps one such process per model host, for engines of one priority
(``LMSP_ENGINE_NICE``: the process runs at it from its start, so every thread its
imports create does too). One is started a moment after an engine of that priority is
up (:meth:`Ahead.refill`), so that its imports do not compete with the engine's first
steps — the resumed tasks' prompts after a crash. The next engine process of that
priority to start takes it instead of spawning (:meth:`Ahead.launch`): it is sent the
spec, and from there on it is that engine (:func:`lmsp.engines.worker.process_main`)
and is replaced in turn once it is up. A process that died meanwhile is not used.

It is a child of the API process and ends as an engine does: its channel closes when
the API process goes (stopped or killed), which ends its wait.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmsp.engines.worker import EngineSpec

log = logging.getLogger("lmsp.engines")

#: seconds after an engine is up before the next process is started ahead
AFTER = 1.0

#: what an engine imports as it loads (the llama.cpp and remote kinds), done ahead
PRELOAD = (
    "lmsp.engines.worker",
    "lmsp.engines.llama_cpp",
    "lmsp.engines.remote",
    "llama_cpp.llama",
    "llama_cpp.llama_chat_format",
    "numpy",
    "llguidance.llamacpp",
)


class Ahead:
    """At most one process waiting to become an engine (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: tuple[BaseProcess, Connection] | None = None
        self._nice = 0  # the waiting process's priority (os.nice)
        self._closed = False
        self._timer: threading.Timer | None = None
        self.taken = 0  # engines started in a process started ahead (a figure)

    @property
    def pid(self) -> int | None:
        """The waiting process's id, if one waits."""
        ready = self._ready
        return None if ready is None else ready[0].pid

    def launch(self, spec: EngineSpec) -> tuple[BaseProcess, Connection] | None:
        """The waiting process, sent ``spec`` (it becomes that engine), and the API's end
        of its channel; ``None`` when none waits at the priority ``spec`` asks, or it
        died meanwhile (killed by an operator or the out-of-memory killer): the caller
        spawns one."""
        with self._lock:
            if self._ready is None or self._nice != spec.options.nice:
                return None
            taken, self._ready = self._ready, None
        process, conn = taken
        try:
            if not process.is_alive():
                raise OSError("it is gone")
            conn.send((spec, os.getpid()))
        except (OSError, ValueError) as exc:
            log.info("the engine process started ahead is not used: %s", exc)
            _end(process, conn)
            return None
        self.taken += 1
        return taken

    def refill(self, nice: int, after: float = AFTER) -> None:
        """Have a process wait for the next engine at priority ``nice``, started
        ``after`` seconds from now — unless one waits or is about to be started (one
        waiting at another priority is ended), or the host is closed."""
        with self._lock:
            if self._closed or self._timer is not None:
                return
            if self._ready is not None and self._nice == nice:
                return
            other, self._ready, self._nice = self._ready, None, nice
            self._timer = threading.Timer(after, self._start)
            self._timer.daemon = True
            self._timer.start()
        if other is not None:
            _end(*other)

    def _start(self) -> None:
        with self._lock:
            self._timer = None
            if self._ready is not None or self._closed:
                return
            ctx = multiprocessing.get_context("spawn")
            here, there = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=waiting,
                args=(there, self._nice),
                name="lmsp-engine (ahead)",
                daemon=True,
            )
            try:
                process.start()
            except OSError as exc:  # no process to be had: engines spawn as they start
                log.warning("no engine process could be started ahead: %s", exc)
                here.close()
                return
            finally:
                there.close()  # its end lives in it only: its death closes ours
            self._ready = (process, here)

    def close(self) -> None:
        """End the waiting process (the host is closing); no other is started."""
        with self._lock:
            self._closed = True
            taken, self._ready = self._ready, None
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if taken is None:
            return
        _end(*taken)


def _end(process: BaseProcess, conn: Connection) -> None:
    conn.close()  # its wait ends
    process.join(5)
    if process.exitcode is None:
        process.kill()
        process.join(5)


def waiting(channel: Connection, nice: int) -> None:
    """The process started ahead: at priority ``nice`` from its start, import what an
    engine needs (on a thread, while this one waits), wait for its spec and the API
    process's id, and be that engine; the channel closing first ends it. Ctrl-C in a
    terminal is for the service, as in an engine."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice > 0:
        os.nice(nice)
    threading.Thread(target=_preload, name="lmsp-preload", daemon=True).start()
    try:
        spec, parent = channel.recv()
    except (EOFError, OSError):
        return
    if os.getppid() != parent:  # pragma: no cover - its API process died meanwhile
        return
    from lmsp.engines.worker import process_main

    process_main(channel, spec, parent, niced=True)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # the engine will say what it lacks
            importlib.import_module(name)
