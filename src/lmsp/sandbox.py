"""Worker processes that read untrusted input under limits.

Why processes: a parser that runs away on hostile input (pypdf's text extraction is
quadratic, llguidance's grammar compiler super-linear) must neither freeze the service
nor eat a core for ever. In a thread it would do both: a thread cannot be stopped, and
pure-Python parsing holds the GIL the event loop needs. A process can be limited and,
if need be, killed.

A :class:`Sandbox` keeps up to ``workers`` processes (each a fresh interpreter running
``python -m lmsp.sandbox``, so it inherits none of the server's threads, locks or main
module; started on first use, and again after it was killed). Each job gets:

- a CPU-time budget: ``ITIMER_PROF`` interrupts Python code when it is spent (the
  worker survives and takes the next job); a worker busy in native code (where no
  Python signal handler runs) is killed by the parent, which reads its CPU time
  (``/proc``) while it waits, or else by ``RLIMIT_CPU`` a second or two later; and the
  parent kills one that has not answered after :data:`WALL_FACTOR` times the budget
  (plus a second) of wall-clock time;
- an address-space limit (``RLIMIT_AS``) for the whole worker: an allocation past it
  is a ``MemoryError`` (or, in native code, the worker's death);
- a lower scheduling priority (``nice``), so the server's own threads come first.

A worker's stderr goes to ``/dev/null`` and its Python logging nowhere: what a parser
prints about a hostile file must not flood the server's log (a job returns what is
worth logging, and the caller logs it with the request's id).

Jobs run through :meth:`Sandbox.run` under a request's :class:`~lmsp.fairgate.Ticket`
share that request's CPU budget and deadline (counted from its arrival), and wait for a
worker in a :class:`~lmsp.fairgate.FairGate`: round robin between clients, so one
client's many jobs never hold another's behind them. A job past its request's CPU is
:class:`Overrun` ``request``; one not done by its request's deadline (waiting or
running) ``deadline``.

A job is a module-level function (pickled by reference) whose arguments and result
pickle; it should return refusals as values. An exception it raises reaches the caller
as :class:`WorkerFailed` with its type and message, never as the object itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from lmsp.fairgate import FairGate, QueueTimeout, Ticket

log = logging.getLogger(__name__)

T = TypeVar("T")

#: wall-clock seconds a job may take, per CPU second of its budget (a worker runs at a
#: lower priority, so on a busy machine it gets less than a core)
WALL_FACTOR = 5.0
#: how long a worker may take to start
START_TIMEOUT = 60.0
#: how often the parent looks at a working worker's CPU time, and the slack it allows
#: past the budget (for the worker's own ``ITIMER_PROF`` to act first)
POLL = 0.1
CPU_SLACK = 0.25
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Overrun(Exception):
    """A job went past a limit: ``limit`` is ``cpu``, ``memory`` or ``wall``, or
    ``crash`` when the worker died of something else (a native abort); ``request`` (its
    request's CPU budget) or ``deadline`` (its request's time) under a ticket."""

    def __init__(self, limit: str, detail: str = "") -> None:
        super().__init__(f"{limit} limit{': ' + detail if detail else ''}")
        self.limit = limit
        self.detail = detail


class WorkerFailed(Exception):
    """A job raised: ``detail`` is its exception's type and message (for the log)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _CpuSpent(BaseException):
    """Raised in a worker by ``SIGPROF`` when the job's CPU budget is spent (a
    ``BaseException``, so a parser's ``except Exception`` does not swallow it)."""


def _cpu_of(pid: int) -> float | None:
    """The CPU seconds process ``pid`` has used (``None`` where ``/proc`` is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _cpu_time() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _on_sigprof(signum: int, frame: Any) -> None:
    raise _CpuSpent()


def _quiet() -> None:
    """No output from the worker (its stderr is ``/dev/null``): logging, warnings off."""
    root = logging.getLogger()
    root.handlers[:] = [logging.NullHandler()]
    root.setLevel(logging.WARNING)
    warnings.simplefilter("ignore")


def _serve(conn: Connection, memory_bytes: int, nice: int) -> None:
    """A worker's loop: take a job, run it under its budget, answer; until the pipe
    closes (the server went away)."""
    _quiet()
    with contextlib.suppress(OSError):
        os.nice(nice)
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    signal.signal(signal.SIGPROF, _on_sigprof)
    _, hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # a job that does not unpickle (an import failed)
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        fn, args, budget = job
        hard_stop = math.ceil(_cpu_time() + budget) + 1
        if hard_cpu != resource.RLIM_INFINITY:
            hard_stop = min(hard_stop, hard_cpu)
        resource.setrlimit(resource.RLIMIT_CPU, (hard_stop, hard_cpu))
        answer: tuple[str, Any]
        try:
            signal.setitimer(signal.ITIMER_PROF, budget)
            try:
                answer = ("ok", fn(*args))
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _CpuSpent:
            answer = ("overrun", "cpu")
        except MemoryError:
            answer = ("overrun", "memory")
        except RecursionError:
            answer = ("error", "RecursionError: nested too deeply")
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}"[:2000])
        try:
            conn.send(answer)
        except MemoryError:
            conn.send(("overrun", "memory"))


class _Worker:
    def __init__(self, memory_bytes: int, nice: int) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        source = str(Path(__file__).resolve().parent.parent)  # where ``lmsp`` is
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (source, env.get("PYTHONPATH"))))
        argv = [sys.executable, "-m", "lmsp.sandbox", str(theirs.fileno())]
        with theirs:
            self.process = subprocess.Popen(
                [*argv, str(memory_bytes), str(nice)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        self.conn = Connection(ours.detach())
        if not self.conn.poll(START_TIMEOUT):
            self.kill()
            raise WorkerFailed("a sandbox worker did not start")
        try:
            self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise WorkerFailed("a sandbox worker did not start") from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(5)
        with contextlib.suppress(Exception):
            self.conn.close()

    def death(self) -> Overrun:
        """Why the process died (it closed its end of the connection)."""
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            return Overrun("crash", "the worker hung up")
        if code == -signal.SIGXCPU:
            return Overrun("cpu")
        if code == -signal.SIGKILL:  # the kernel's OOM killer, or ours
            return Overrun("memory", "killed")
        return Overrun("crash", f"exit code {code}")


class Sandbox:
    """Up to ``workers`` worker processes, each job under ``memory_bytes`` of address
    space and its own CPU budget (see the module docstring). Thread-safe."""

    def __init__(self, workers: int = 2, *, memory_bytes: int = 1 << 30, nice: int = 10) -> None:
        self.workers = max(1, workers)
        self.memory_bytes = memory_bytes
        self.nice = nice
        # a slot per worker: ``None`` until the first job that needs it starts it
        self._slots: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(self.workers):
            self._slots.put(None)
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="lmsp-sandbox")
        self.gate = FairGate(self.workers)  # the jobs of :meth:`run`, fair between clients
        self._closed = False
        #: jobs run, and limits hit by kind (for tests and metrics)
        self.jobs = 0
        self.overruns: dict[str, int] = {}

    def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        cpu_seconds: float,
        deadline: float | None = None,
        ticket: Ticket | None = None,
        wall_seconds: float | None = None,
    ) -> T:
        """``fn(*args)`` in a worker, blocking. :class:`Overrun` past a limit,
        :class:`WorkerFailed` if ``fn`` raised. Its wall-clock limit is
        :data:`WALL_FACTOR` times ``wall_seconds`` (default: ``cpu_seconds``) plus a
        second, and ``deadline`` (``time.monotonic()``) if sooner; the CPU it took is
        charged to ``ticket``."""
        if self._closed:
            raise WorkerFailed("the sandbox is closed")
        worker = self._slots.get()
        if self._closed:  # closed while this call waited for a worker
            self._slots.put(worker)
            raise WorkerFailed("the sandbox is closed")
        try:
            if worker is None:
                worker = _Worker(self.memory_bytes, self.nice)
                with self._lock:
                    self._live.add(worker)
            wall = (wall_seconds or cpu_seconds) * WALL_FACTOR + 1.0
            kind, value = self._run(worker, fn, args, cpu_seconds, wall, deadline, ticket)
        except Overrun as exc:
            self._count(exc.limit)
            self._retire(worker)
            worker = None
            raise
        except BaseException:
            self._retire(worker)
            worker = None
            raise
        finally:
            self._slots.put(worker)
        self.jobs += 1
        if kind == "ok":
            result: T = value
            return result
        if kind == "overrun":
            self._count(str(value))
            raise Overrun(str(value))
        raise WorkerFailed(str(value))

    def _run(
        self,
        worker: _Worker,
        fn: Any,
        args: tuple[Any, ...],
        budget: float,
        wall: float,
        until: float | None = None,
        ticket: Ticket | None = None,
    ) -> Any:
        try:
            worker.conn.send((fn, args, budget))
        except (OSError, ValueError) as exc:
            raise Overrun("crash", f"the worker is gone ({exc})") from None
        deadline = time.monotonic() + wall
        if until is not None and until < deadline:
            deadline, wall = until, -1.0  # the request's deadline comes first
        began = _cpu_of(worker.pid)
        try:
            return self._wait(worker, budget, deadline, wall, began)
        finally:
            if ticket is not None:
                used = _cpu_of(worker.pid)
                took = used - began if used is not None and began is not None else budget
                ticket.spend(took)

    def _wait(
        self, worker: _Worker, budget: float, deadline: float, wall: float, began: float | None
    ) -> Any:
        try:
            while not worker.conn.poll(max(0.0, min(POLL, deadline - time.monotonic()))):
                if not worker.alive():
                    raise worker.death()
                used = _cpu_of(worker.pid)
                if began is not None and used is not None and used - began > budget + CPU_SLACK:
                    if worker.conn.poll(0):  # it answered meanwhile
                        break
                    raise Overrun("cpu", f"{used - began:.1f}s of CPU time")
                if time.monotonic() >= deadline:
                    if wall < 0:
                        raise Overrun("deadline", "the request's time is up")
                    raise Overrun("wall", f"no answer after {wall:.1f}s")
            return worker.conn.recv()
        except (EOFError, OSError):
            raise worker.death() from None

    def _retire(self, worker: _Worker | None) -> None:
        if worker is None:
            return
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def _count(self, limit: str) -> None:
        with self._lock:
            self.overruns[limit] = self.overruns.get(limit, 0) + 1

    async def run(
        self, fn: Callable[..., T], *args: Any, cpu_seconds: float, ticket: Ticket | None = None
    ) -> T:
        """:meth:`call` from the event loop (which goes on serving meanwhile), after a
        turn in the fair queue. Under ``ticket`` the job takes at most what is left of
        its request's CPU budget (:class:`Overrun` ``request`` past it) and must be done
        by its deadline (``deadline``)."""
        budget, owner, until = cpu_seconds, "", None
        if ticket is not None:
            left = ticket.left()
            if left <= 0:
                raise Overrun("request", f"{ticket.spent:.1f}s of CPU time already")
            budget, owner, until = min(cpu_seconds, left), ticket.owner, ticket.deadline
        try:
            await self.gate.enter(owner, until)
        except QueueTimeout:
            self._count("deadline")
            raise Overrun("deadline", "no worker was free in time") from None
        loop = asyncio.get_running_loop()
        call = functools.partial(
            self.call,
            fn,
            *args,
            cpu_seconds=budget,
            deadline=until,
            ticket=ticket,
            wall_seconds=cpu_seconds,  # a job's own wall-clock limit is not clipped
        )
        try:
            return await loop.run_in_executor(self._threads, call)
        except Overrun as exc:
            if exc.limit == "cpu" and ticket is not None and budget < cpu_seconds:
                ticket.exhaust()
                raise Overrun("request", exc.detail) from None  # the request's, not the job's
            raise
        finally:
            self.gate.leave()

    def pids(self) -> list[int]:
        """The worker processes alive now."""
        with self._lock:
            return [w.pid for w in self._live]

    def close(self) -> None:
        """Stop every worker (a job in flight gets :class:`Overrun`)."""
        self._closed = True
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for worker in live:
            worker.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":  # a worker: ``python -m lmsp.sandbox FD MEMORY NICE``
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]))
