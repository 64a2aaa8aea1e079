"""The runner: the one place that turns engine outcomes and exceptions into task states
and events.

``parallel`` worker threads take queued tasks in the fair order of the claim
(:func:`lmsp.store.tasks.claim_next`; tasks recovered in ``running`` with ``on_restart:
resume`` first); ``reserved`` more workers, each with a sequence of its own, take only a
task of a client with nothing running, and only while every other sequence is busy: a
client's first request starts at once instead of waiting for one of another client's
tasks to end (``LMSP_RESERVED_SEQUENCES``). A create that finds a regular worker waiting
submits that worker's claim right behind its own write (:meth:`Runner.claim_beside`,
:mod:`lmsp.runner.idlers`): the writer commits both in one transaction, and the worker
starts as soon as it is answered. Workers move tasks ``loading → running →``
terminal; each hands its task to an attempt (:mod:`lmsp.runner.attempt`: a plain
response is one turn, :mod:`lmsp.runner.mcp_loop` turns and journaled calls), which
generates it and logs its text deltas in batches, each with the snapshot that covers it,
through the small public context the runner lends it (:meth:`Runner._context`: fenced
writes, terminal writes, cancels, the generation in the engine, what it consumed). The
engine runs in a process of its own (:mod:`lmsp.engines.client`); each worker submits its
task's sequence there and reads its pieces, checking each one against a committed cancel
before it is shown.

When the engine process dies, the worker keeps the pieces that came before, logs them,
and its task follows its ``on_restart`` policy with the error code ``engine_crashed``
(:func:`lmsp.runner.durable.settle_interrupted`, the recovery table); the model host
starts the engine again.

However a task ends (completed, cancelled, failed, its client revoked), it is charged
what it consumed: the prompt tokens given to the engine and the tokens generated, as
its generation loop reports them (:meth:`Runner.spent`), in the transaction of its
terminal move.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.base import EngineCrashed, EngineError, Generation
from lmsp.engines.host import ModelHost
from lmsp.errors import LmspError
from lmsp.metrics import Metrics
from lmsp.outbound.pull import Downloader
from lmsp.protocol.records import TaskRecord
from lmsp.protocol.states import Status
from lmsp.runner import durable, early, mcp_loop, plain, revocation
from lmsp.runner.attempt import Job, TaskContext
from lmsp.runner.idlers import Idlers
from lmsp.store import models, nodes, pulls, retrying
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.db import Database
from lmsp.store.health import is_storage_error
from lmsp.store.nodes import Node
from lmsp.store.sql import Conn

log = logging.getLogger(__name__)

#: what a claim took: the task, and whether the claim started it (moved it to running)
Taken = tuple[TaskRecord, bool]


class Runner:
    def __init__(
        self,
        db: Database,
        host: ModelHost,
        *,
        parallel: int = 1,
        reserved: int = 0,
        flush_interval: float = 0.1,
        metrics: Metrics | None = None,
    ) -> None:
        self.db = db
        self.metrics = metrics or Metrics()
        self.host = host
        self.parallel = parallel
        self.reserved = reserved
        self._regular_busy = 0  # of the ``parallel`` workers, those holding a task
        self._busy_lock = threading.Lock()
        self.flush_interval = flush_interval
        self._idlers = Idlers()  # the regular workers waiting (runner/idlers.py)
        # the reserved workers wait apart: a wake one of them takes without claiming
        # (its sequence is not needed) must not be lost to a regular worker
        self._reserve_wake = threading.Condition()
        self._stop = threading.Event()  # workers take no more tasks
        self._shutdown = threading.Event()  # tasks in flight stop where they are
        self._cancels: set[str] = set()
        self._live: dict[str, Generation] = {}  # task id → its generation in the engine
        #: task id → its first turn begun early, until its attempt's first generation
        self._early: dict[str, early.Drop] = {}
        # task id → what it has consumed so far (its generation loop's count)
        self._spent: dict[str, Callable[[], dict[str, int]]] = {}
        self._resume: deque[str] = deque()
        self._threads: list[threading.Thread] = []
        self.busy = 0
        # on a database nodes share: this node under its lease (cluster/nodes.py), and the
        # lease each task in flight was claimed under, which fences its every write
        self.node: Node | None = None
        self._held: dict[str, Node | None] = {}
        # the downloader a pull task goes to instead of the engine (outbound/pull.py)
        self.pulls: Downloader | None = None
        # the compile budget what a task builds at run time is checked under (an MCP
        # server's inputSchemas: runner/mcp_loop.py); the service's, shared with the API
        self.grammars: GrammarBudget | None = None

    # -- control -------------------------------------------------------------------------
    def start(self, resume: list[str] | None = None) -> None:
        """Start the workers; ``resume``: tasks recovery left ``running`` (on a shared
        database they are claimed like any other task, by whichever node comes first)."""
        if self.node is None:
            self._resume.extend(resume or [])
        if self.pulls is not None:
            self.pulls.owner = lambda: self.node
            self.pulls.start()
        for slot in range(self.parallel + self.reserved):
            thread = threading.Thread(
                target=self._work, args=(slot,), name=f"lmsp-runner-{slot}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def notify(self) -> None:
        """A task was queued: wake a worker."""
        self._idlers.wake()
        if self.reserved:
            with self._reserve_wake:
                self._reserve_wake.notify_all()

    def heard(self, task_id: str, status: str | None) -> None:
        """Another node changed a task (:meth:`Database.on_task_change`): a cancel of one
        this node generates or downloads reaches it here; a task queued there wakes a
        worker here.

        Not a task another node moved to ``running`` or logged to (every flush of a
        generating task's text updates its row): waking a claim on each would cost every
        node a claim per flush of every other node. A lost node's task left ``running``
        for its next holder is claimed by the rescuer's own runner at once (it is told)
        and by any other node's idle workers, which look again every half second."""
        if status == Status.CANCELLING and task_id in self._held:
            self.request_cancel(task_id)
        elif status == Status.CANCELLING and self.pulls is not None:
            self.pulls.cancel(task_id)  # a pull this node downloads (its own claim)
        elif status == Status.QUEUED:
            self.notify()

    def lease_lost(self) -> None:
        """This node's lease was lost: its tasks in flight are other nodes' now. Stop
        generating them; their writes are fenced, so none of them lands."""
        for task_id in list(self._held):
            self.request_cancel(task_id)

    def _fenced(self, task_id: str, job: Any) -> Any:
        """``job`` preceded, in its transaction, by the check that this node still holds
        ``task_id`` under the lease it claimed it with (nothing to check on a database
        of one node)."""
        holder = self._held.get(task_id, self.node)
        if holder is None:
            return job

        def fenced(conn: Conn) -> Any:
            nodes.fence(conn, task_id, holder)
            return job(conn)

        return fenced

    def request_cancel(self, task_id: str) -> None:
        """A cancel committed: show no more of ``task_id``'s tokens, and have the engine
        stop its sequence (its iteration then ends, even inside a long prompt)."""
        self._cancels.add(task_id)
        if self.pulls is not None:
            self.pulls.cancel(task_id)
        generation = self._live.get(task_id)
        if generation is not None:
            generation.cancel()

    def spent(self, task_id: str) -> dict[str, int] | None:
        """The usage of a task in flight so far (``None`` before its prompt went to the
        engine): what it is charged, however it ends."""
        count = self._spent.get(task_id)
        return None if count is None else count()

    def pause(self, timeout: float = 30) -> None:
        """Stop the worker threads once their current task ends (``run_next`` still works)."""
        self._stop.set()
        self._idlers.wake_all()
        with self._reserve_wake:
            self._reserve_wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def stop(self, timeout: float = 30) -> None:
        """Shut down: tasks in flight persist what they have and keep their state, for
        startup recovery to apply their ``on_restart`` policy."""
        self._shutdown.set()
        for generation in list(self._live.values()):
            generation.interrupt()
        if self.pulls is not None:
            self.pulls.stop()
        self.pause(timeout)

    # -- the test helper: run the next task in this thread ---------------------------------
    def run_next(self, slot: int = 0) -> str | None:
        """Run the next task to its end in the calling thread; its id, or ``None``.
        A slot past ``parallel`` is a reserved one (see the module's docstring)."""
        reserved = slot >= self.parallel
        if reserved and self._regular_busy < self.parallel:
            return None  # a sequence of its own is free: no client needs the reserve
        resume = None
        if not reserved:
            with contextlib.suppress(IndexError):
                resume = self._resume.popleft()
        if resume is not None:
            with self._holding(reserved):
                self._run(resume, slot, resumed=True)
            return resume
        node = self.node
        # on a shared database, only tasks of models whose blob this node has
        digests = None if node is None else self._local_digests()
        if not self._anything_to_claim(node):
            return None
        taken: Taken | None = self.db.write_sync(lambda c: self._claim(c, node, digests, reserved))
        return self._take(taken, slot, node, reserved)

    def _take(
        self, taken: Taken | None, slot: int, node: Node | None, reserved: bool
    ) -> str | None:
        """Run what a claim took (the task, and whether the claim started it) to its end."""
        if taken is None:
            return None
        claimed, started = taken
        if node is not None:
            self._held[claimed.id] = node
        with self._holding(reserved):
            # a task a lost node left running is resumed from its snapshot
            resumed = claimed.status is not Status.LOADING and not started
            self._run(claimed.id, slot, resumed=resumed, started=started)
        return claimed.id

    def _anything_to_claim(self, node: Node | None) -> bool:
        """Is a task waiting for a claim at all? A read, so that an idle worker's look
        every half second costs the writer nothing (a claim is a write transaction);
        a task queued after this read wakes a worker (:meth:`notify`)."""
        return task_store.claimable(self.db.reader(), shared=node is not None)

    def claim_beside(
        self, first: early.FirstTurn | None = None
    ) -> concurrent.futures.Future[Taken | None] | None:
        """A waiting regular worker's claim, submitted to the writer now, just after a
        create's write, so that both go in one transaction (:mod:`lmsp.runner.idlers`):
        its future, or ``None`` when no worker waits (then :meth:`notify` wakes one).
        The worker begins ``first`` meanwhile (:mod:`lmsp.runner.early`)."""
        if self._stop.is_set():
            return None
        node = self.node
        digests = None if node is None else self._local_digests()
        return self._idlers.hand(
            lambda: self.db.submit(lambda c: self._claim(c, node, digests, False)), first
        )

    def _claim(
        self, conn: Conn, node: Node | None, digests: list[str] | None, reserved: bool
    ) -> Taken | None:
        """Claim the next task (:func:`lmsp.store.tasks.claim_next`) and, for a fresh
        one whose model this node's engine holds already (:meth:`ModelHost.ready`: no
        load to wait for), move it on to ``running`` in the same transaction, through
        the same guarded move :meth:`_begin` makes — one writer job, not two. The task,
        and whether it was started."""
        task = task_store.claim_next(conn, node, digests, newcomer=reserved)
        if task is None:
            return None
        if task.status is not Status.LOADING:
            return task, False
        return task, self._start_claimed(conn, task, node)

    def _start_claimed(self, conn: Conn, task: TaskRecord, node: Node | None) -> bool:
        if self.pulls is not None and pulls.is_pull(conn, task.id):
            return False  # the downloader runs it
        response = task_store.get_response(conn, task.response_id)
        record = models.get(conn, response.model) if response is not None else None
        if record is None or not self.host.ready(record):
            return False  # a load first: started once it is ready (_begin)
        try:  # the checks of every later step; one failing leaves it to _begin
            if node is not None:
                nodes.fence(conn, task.id, node)
            revocation.check(conn, task.id)
        except (nodes.LeaseLost, revocation.ClientRevoked):
            return False
        return task_store.start(conn, task.id, record.digest) is not None

    @contextlib.contextmanager
    def _holding(self, reserved: bool) -> Iterator[None]:
        """A regular worker counts as busy while it runs a task (the reserved ones
        claim only while all of them do)."""
        if reserved:
            yield
            return
        with self._busy_lock:
            self._regular_busy += 1
        try:
            yield
        finally:
            with self._busy_lock:
                self._regular_busy -= 1

    def _local_digests(self) -> list[str]:
        """The digests of the model blobs in this node's data directory."""
        blobs = self.host.blobs_dir
        if not blobs.is_dir():
            return []
        return sorted(
            f"sha256:{path.name.removeprefix('sha256-')}" for path in blobs.glob("sha256-*")
        )

    def _work(self, slot: int) -> None:
        backoff = retrying.Backoff(0.1, 1.0)
        while not self._stop.is_set():
            if not self.db.health.ok and not self._storage_back():
                self._stop.wait(backoff.next())  # the disk is full: take no task
                continue
            backoff.reset()
            try:
                ran = self.run_next(slot)
            except Exception as exc:
                if not is_storage_error(exc):  # pragma: no cover - a bug; keep the worker alive
                    log.exception("runner slot %d failed", slot)
                ran = None  # a claim refused for lack of space: the health check waits
                time.sleep(0.1)
            if ran is None:
                self.host.reap()  # idle: unload models past their keep-alive
                if slot < self.parallel:
                    self._wait_idle(slot)
                    continue
                with self._reserve_wake:
                    self._reserve_wake.wait(timeout=0.5)

    def _wait_idle(self, slot: int) -> None:
        """A regular worker with nothing to do waits for a wake (or half a second); a
        claim a create handed it (:meth:`claim_beside`) it runs here once committed."""
        handed = self._idlers.wait(0.5)
        if handed is None:
            return
        claim, first = handed
        # while the writer commits: the create's first turn begun in its engine
        drop = None if first is None else early.begin(first, self.host)
        try:
            taken = claim.result()
        except Exception as exc:  # its transaction failed: nothing was claimed
            if not is_storage_error(exc):
                log.warning("a claim beside a create failed: %s", exc)
            taken = None
        if drop is not None and taken is not None and early.claimed(first, taken):
            self._early[taken[0].id] = drop  # settled at its attempt's first generation
        elif drop is not None:
            self._drop_early(drop)  # not this worker's task (or none): not wanted
        try:
            self._take(taken, slot, self.node, reserved=False)
        finally:
            if taken is not None and (left := self._early.pop(taken[0].id, None)):
                self._drop_early(left)  # it ended before asking its engine for anything

    def _drop_early(self, drop: early.Drop) -> None:
        try:
            closed = drop()
        except Exception:  # pragma: no cover - a bug; keep the worker alive
            log.exception("a first turn begun early was not closed")
            return
        self.metrics.early_start("dropped" if closed else "adopted")

    def _storage_back(self) -> bool:
        """While writes fail: does a small write go through again?"""
        try:
            self.db.write_sync(retrying.probe)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            return False
        return True

    def _durably(self, task_id: str, job: Any) -> Any:
        """A terminal write: retried while the disk is full (``None`` at shutdown)."""
        fenced = self._fenced(task_id, job)
        return retrying.write_until_done(self.db, fenced, self._shutdown, f"task {task_id}")[1]

    def _interrupted(self, task_id: str, crash: EngineCrashed | None = None) -> None:
        """A write of the task failed for lack of space, or its engine died: its
        ``on_restart`` policy decides, as after a restart (failed, requeued, or resumed
        from its snapshot)."""
        usage = self.spent(task_id)
        if crash is None:
            why = "the disk is full"
            outcome = self._durably(
                task_id, lambda c: durable.settle_interrupted(c, task_id, usage=usage)
            )
        else:
            why = "its engine stopped"
            outcome = self._durably(
                task_id,
                lambda c: durable.settle_interrupted(c, task_id, crash.code, crash.message, usage),
            )
        log.warning(
            "task %s broke off, %s: %s",
            task_id,
            why,
            outcome,
            extra={"task_id": task_id, "event": "task.interrupted"},
        )
        if outcome == "resume" and self.node is None:  # shared: the next claim resumes it
            self._resume.append(task_id)
        if outcome in ("resume", "requeued"):
            self.notify()

    # -- one task --------------------------------------------------------------------------
    def _run(self, task_id: str, slot: int, resumed: bool, started: bool = False) -> None:
        if not started and self.pulls is not None and self.pulls.take(task_id, resumed):
            return  # a model pull: the downloader runs it, on a thread of its own
        self.busy += 1
        try:
            self._outcome(task_id, slot, resumed, started)
        except nodes.LeaseLost:  # its run, or the write of its end, was fenced off
            log.warning(
                "task %s: this node no longer holds it; dropped without a write",
                task_id,
                extra={"task_id": task_id, "event": "task.lease_lost"},
            )
        finally:
            self.metrics.end(task_id)
            self._live.pop(task_id, None)
            self._spent.pop(task_id, None)
            self.host.release(slot)
            self._cancels.discard(task_id)
            self._held.pop(task_id, None)
            log_outcome(self.db, task_id)
            self.busy -= 1

    def _outcome(self, task_id: str, slot: int, resumed: bool, started: bool) -> None:
        """Run the task; turn what went wrong into its state."""
        try:
            self._execute(task_id, slot, resumed, started)
        except nodes.LeaseLost:
            raise
        except revocation.ClientRevoked:  # its client was revoked: cancelled
            usage = self.spent(task_id)
            self._durably(task_id, lambda c: revocation.cancel(c, task_id, usage))
        except EngineCrashed as exc:
            if not self._shutdown.is_set():  # at shutdown, startup recovery decides
                self._interrupted(task_id, exc)
        except EngineError as exc:
            self._fail(task_id, exc.code, exc.message)
        except Exception as exc:
            if is_storage_error(exc):
                self._interrupted(task_id)
                return
            if isinstance(exc, LmspError):  # a refusal, e.g. its history was deleted
                self._fail(task_id, exc.code, exc.message)
                return
            log.exception("task %s failed", task_id, extra={"task_id": task_id})
            self._fail(task_id, "engine_error", f"The engine failed: {type(exc).__name__}.")

    def _fail(self, task_id: str, code: str, message: str) -> None:
        corrupt = self._model_of(task_id) if code == "model_corrupt" else None
        usage = self.spent(task_id)

        def job(conn: Conn) -> None:
            if corrupt is not None:  # the blob failed its check: no task may use it
                models.mark_corrupt_digest(conn, corrupt.digest)
            task_store.fail(conn, task_id, code, message, usage=usage)
            # a cancel that came first still wins
            task_store.finish_cancel(conn, task_id, usage)

        self._durably(task_id, job)
        if corrupt is not None:
            log.error("model %s is corrupt: %s", corrupt.id, message)
            self.host.evict(corrupt)

    def _model_of(self, task_id: str) -> models.ModelRecord | None:
        conn = self.db.reader()
        task = task_store.get(conn, task_id)
        response = task_store.get_response(conn, task.response_id) if task else None
        return models.get(conn, response.model) if response else None

    def _live_generation(self, task_id: str, generation: Generation | None) -> None:
        """``task_id``'s generation went to its engine: cancellable, and its prompt's
        progress shown (``lmsp ps``) as the engine tells it; ``None``: it ended."""
        if generation is None:
            self._live.pop(task_id, None)
            return
        self._live[task_id] = generation
        if (begun := self._early.pop(task_id, None)) is not None:
            self._drop_early(begun)  # adopted just now, or not wanted: cancelled
        generation.watch(lambda p: self.metrics.read(task_id, p.read, p.total, p.rate()))
        if task_id in self._cancels:  # committed while it was being submitted
            generation.cancel()

    def _context(self, task_id: str) -> TaskContext:
        """What the attempt running ``task_id`` may use of this runner."""

        def write(job: Job) -> concurrent.futures.Future[Any]:
            return self.db.submit(self._fenced(task_id, revocation.guarded(task_id, job)))

        def charge(usage: Callable[[], dict[str, int]]) -> None:
            self._spent[task_id] = usage

        return TaskContext(
            id=task_id,
            metrics=self.metrics,
            flush_interval=self.flush_interval,
            write=write,
            durably=lambda job: self._durably(task_id, job),
            cancelled=lambda: task_id in self._cancels,
            shutting_down=self._shutdown.is_set,
            live=lambda generation: self._live_generation(task_id, generation),
            charge=charge,
        )

    def _cancelled(self, task_id: str) -> None:
        """The runner stopped a task a cancel reached: ``cancelled``, charged its usage."""
        usage = self.spent(task_id)
        self._durably(task_id, lambda conn: task_store.finish_cancel(conn, task_id, usage))

    def _begin(self, task_id: str, digest: str, resumed: bool) -> bool:
        """Move the task to ``running`` (a resumed one is there: noted as resumed);
        ``False`` if a cancel won while it was loading, or before the resume."""

        def move(conn: Conn) -> bool:
            if resumed:
                return task_store.mark_resumed(conn, task_id, digest)
            return task_store.start(conn, task_id, digest) is not None

        return bool(self.db.write_sync(self._fenced(task_id, revocation.guarded(task_id, move))))

    def _execute(self, task_id: str, slot: int, resumed: bool, started: bool = False) -> None:
        """Run the task in its engine; ``started``: its claim moved it to ``running``
        already (:meth:`_claim`)."""
        conn = self.db.reader()
        task = task_store.get(conn, task_id)
        if task is None:
            return
        response = task_store.get_response(conn, task.response_id)
        assert response is not None
        request = response_store.given_request(conn, response)  # its history, as given
        record = models.get(conn, response.model)
        if record is None:
            raise EngineError("model_load_failed", f"The model {response.model!r} is gone.")
        model = self.host.get(record, slot)
        if not started and not self._begin(task_id, record.digest, resumed):
            self._cancelled(task_id)  # a cancel won while loading, or before the resume
            return
        self.metrics.begin(task_id, record.id)
        context = self._context(task_id)
        if mcp_loop.applies(request):  # MCP tools: the loop runs the task (runner/mcp_loop.py)
            mcp_loop.run(context, conn, response, request, model, resumed, self.grammars)
        else:
            plain.respond(context, conn, request, model, resumed)


def log_outcome(db: Database, task_id: str) -> None:
    """One line when the runner leaves a task: its state and size (no text)."""
    conn = db.reader()
    task = task_store.get(conn, task_id)
    if task is None:
        return
    log.info(
        "task %s left the runner %s (attempt %d, %d events)",
        task_id,
        task.status,
        task.attempt,
        task.last_sequence_number + 1,
        extra={
            "event": "task.run_ended",
            "task_id": task_id,
            "response_id": task.response_id,
            "client_id": task.client_id,
            "status": task.status.value,
            "error_code": task.error_code,
        },
    )


def status_of(db: Database, task_id: str) -> Status | None:
    task = task_store.get(db.reader(), task_id)
    return None if task is None else task.status
