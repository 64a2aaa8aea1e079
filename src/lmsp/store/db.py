"""Connections, pragmas and the single writer with group commit.

Every write goes through :class:`Database.write` (async) or :meth:`Database.write_sync`
(threads). One writer thread drains the queue and runs as many jobs as are waiting in
one ``BEGIN IMMEDIATE`` transaction, each inside its own savepoint so a job that raises
rolls back only itself. Callers are answered only after the ``COMMIT`` has returned,
so an answer means the write is on disk (``synchronous=FULL``).

A full disk (``SQLITE_FULL``, ``ENOSPC``) anywhere in a transaction rolls the whole
batch back. If :attr:`Database.relief` frees space (the prefix cache evicts what it
holds), the batch is run once more; otherwise every job in it is answered with
``LmspError("insufficient_storage")`` (``507`` at the API) and :attr:`Database.health`
marked degraded: nothing is half-written.

Test seam: :attr:`Database.faults` is ``None`` and nothing in lmsp sets it. A test sets
it to a :class:`Faults` to make chosen jobs or commits fail exactly as a full disk makes
them fail (the faults campaign in ``tests/campaigns`` does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lmsp.datadir import create_private_file
from lmsp.store.health import StorageHealth, insufficient_storage, is_storage_error
from lmsp.store.migrations import migrate
from lmsp.store.sql import SQLITE, Conn
from lmsp.store.tail import Tail

if TYPE_CHECKING:
    from lmsp.datadir import DataDirLock
    from lmsp.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[Conn], Any]
AfterCommit = Callable[[], None]

MAX_BATCH = 256
# times a batch runs again after a failure :meth:`Database._retryable` calls transient
RETRIES = 5
# how many tasks :meth:`Versions.task` remembers (the least recently changed go first)
TASK_STAMPS = 10_000

# tables whose changes bump :attr:`Database.versions` (and which columns of an UPDATE
# count, every one when none is named): caches of rows (the API's token cache, the
# creates' model records) compare versions instead of re-reading
WATCHED: dict[str, tuple[str, ...]] = {
    "clients": ("token_prefix", "token_hash", "scopes", "name", "revoked_at"),
    "models": (),
    "model_aliases": (),
    "webhook_deliveries": (),  # the outbox: its sender wakes when it changed
}


class Connection(sqlite3.Connection):
    """A connection that notes the events appended in its open transaction (the
    writer's: published to :class:`~lmsp.store.tail.Tail` and counted once committed)."""

    appended: list[tuple[str, int, str, str]] | None = None
    dialect = SQLITE
    for_update = ""


def connect(path: Path | str) -> Connection:
    """Open a connection with the pragmas lmsp relies on.

    Autocommit mode (``isolation_level=None``): transactions are explicit, writes use
    ``BEGIN IMMEDIATE``.
    """
    conn = sqlite3.connect(
        str(path), isolation_level=None, check_same_thread=False, timeout=30, factory=Connection
    )
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


@dataclass
class Faults:
    """A test seam: fail chosen writes the way a full disk fails them.

    Jobs and commits are counted from 1 since the faults were set. A job whose number is
    in ``jobs`` raises ``SQLITE_FULL`` inside its transaction; a commit whose number is
    in ``commits`` raises it instead of committing; with ``all_writes`` every job fails
    (a disk that stays full) until the test sets it back to ``False``.
    """

    jobs: set[int] = field(default_factory=set)
    commits: set[int] = field(default_factory=set)
    all_writes: bool = False
    jobs_seen: int = 0
    commits_seen: int = 0
    injected: int = 0

    def _fail(self) -> None:
        self.injected += 1
        exc = sqlite3.OperationalError("database or disk is full")
        exc.sqlite_errorcode = sqlite3.SQLITE_FULL
        exc.sqlite_errorname = "SQLITE_FULL"
        raise exc

    def job(self) -> None:
        self.jobs_seen += 1
        if self.all_writes or self.jobs_seen in self.jobs:
            self._fail()

    def commit(self) -> None:
        self.commits_seen += 1
        if self.commits_seen in self.commits:
            self._fail()


class Versions:
    """Change counters of the :data:`WATCHED` tables, readable from any thread.

    A write that changes a watched table bumps its counter twice: when the row changes
    (inside the transaction) and again after the transaction ended, before any job of it
    is answered. A reader that takes the version *before* reading a row and keeps the
    pair can trust the row exactly as long as the version is unchanged: a row read while
    a change was uncommitted was read under the first bump and is outdated by the second.
    """

    def __init__(self) -> None:
        self._counts = dict.fromkeys(WATCHED, 0)
        self._lock = threading.Lock()
        # task id → stamp of the last committed change to its row or its events; stamps
        # come from one counter, so an evicted and re-added task never repeats a stamp
        self._tasks: OrderedDict[str, int] = OrderedDict()
        self._stamp = 0

    def __getitem__(self, table: str) -> int:
        return self._counts[table]

    def bump(self, table: str) -> None:
        with self._lock:
            self._counts[table] += 1

    def task(self, task_id: str) -> int | None:
        """The stamp of the task's last committed change, ``None`` when unknown (not
        changed since this process opened the database, or evicted): a reader that saw
        the task under a stamp need not read it again while the stamp is the same."""
        return self._tasks.get(task_id)

    def stamp_tasks(self, task_ids: set[str]) -> None:
        with self._lock:
            for task_id in task_ids:
                self._stamp += 1
                self._tasks[task_id] = self._stamp
                self._tasks.move_to_end(task_id)
            while len(self._tasks) > TASK_STAMPS:
                self._tasks.popitem(last=False)


def _watch(
    conn: sqlite3.Connection, changed: Callable[[str], None], task: Callable[[str], None]
) -> None:
    """Temporary triggers on ``conn`` (the writer's) that report changes of watched tables
    and of tasks (their row or their event log)."""

    def report(table: str) -> None:
        changed(table)

    conn.create_function("lmsp_changed", 1, report)
    conn.create_function("lmsp_task_changed", 1, task)
    for name, when, row in (
        ("lmsp_watch_task_events", "INSERT ON main.task_events", "NEW.task_id"),
        ("lmsp_watch_tasks_update", "UPDATE ON main.tasks", "NEW.id"),
        ("lmsp_watch_tasks_delete", "DELETE ON main.tasks", "OLD.id"),
    ):
        conn.execute(
            f"CREATE TEMP TRIGGER {name} AFTER {when} BEGIN SELECT lmsp_task_changed({row}); END"
        )
    for table, columns in WATCHED.items():
        update = f"UPDATE OF {', '.join(columns)}" if columns else "UPDATE"
        for when in ("INSERT", "DELETE", update):
            name = f"lmsp_watch_{table}_{when.split()[0].lower()}"
            conn.execute(
                f"CREATE TEMP TRIGGER {name} AFTER {when} ON main.{table}"
                f" BEGIN SELECT lmsp_changed('{table}'); END"
            )


class _StorageFull(Exception):
    """A job hit a full disk: the whole transaction must go."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Request:
    __slots__ = ("future", "job")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


class Database:
    """The data directory's database: thread-local readers plus one group-commit writer."""

    #: what opens a write transaction (``BEGIN IMMEDIATE``: SQLite takes its write lock
    #: at once, so a batch never fails half-way for a lock another process took)
    BEGIN = "BEGIN IMMEDIATE"
    #: ``"sqlite"`` or ``"postgres"`` (what :attr:`lmsp.store.sql.Conn.dialect` says)
    dialect = SQLITE
    #: shared by several nodes (PostgreSQL): leases, fencing and the rescuer apply
    shared = False

    def __init__(self, path: Path | str, lock: DataDirLock | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        create_private_file(self.path)  # 0600; the -wal and -shm files take its mode
        with_conn = connect(self.path)
        try:
            migrate(with_conn)
        finally:
            with_conn.close()
        writer = connect(self.path)
        self._start(writer, lock)
        _watch(writer, self._on_change, self._tasks_changed.add)
        self._thread.start()

    def _start(self, writer: Any, lock: DataDirLock | None) -> None:
        """The state every store shares; the writer thread is created, not started."""
        self.lock = lock  # released by :meth:`close`
        self.health = StorageHealth()
        self.faults: Faults | None = None  # test seam, see the module docstring
        # called (in the writer thread) when a transaction failed for lack of space:
        # frees what it can and says how many bytes (the prefix cache's ``relieve``)
        self.relief: Callable[[], int] | None = None
        self.metrics: Metrics | None = None  # the service's, once it runs
        self._local = threading.local()
        self._readers: list[Any] = []
        self._readers_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._writer_conn = writer
        self.versions = Versions()
        #: the events this process committed last, for their followers (store/tail.py)
        self.tail = Tail()
        self._changed: set[str] = set()  # watched tables changed in this transaction
        self._tasks_changed: set[str] = set()  # tasks changed in this transaction
        self._listeners: list[Callable[[], None]] = []
        self._closed = False
        self.commits = 0
        self.jobs = 0
        self._thread = threading.Thread(target=self._run, name="lmsp-writer", daemon=True)

    def _connect(self) -> Any:
        """A new connection (a reader's)."""
        return connect(self.path)

    def _control(self, conn: Any, statements: list[str]) -> None:
        """The writer's transaction control statements (``BEGIN``, savepoints, ``COMMIT``),
        in order: one call each here (SQLite runs in this process)."""
        for statement in statements:
            conn.execute(statement)

    def _retryable(self, exc: BaseException) -> bool:
        """A transaction failure that running the batch again may mend (PostgreSQL's
        serialization failures and deadlocks; never with SQLite's single writer)."""
        return False

    # -- reads ---------------------------------------------------------------------------
    def reader(self) -> Conn:
        """A connection for reads, one per thread."""
        conn: Conn | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    # -- writes --------------------------------------------------------------------------
    def submit(self, job: Job) -> concurrent.futures.Future[Any]:
        if self._closed:
            raise RuntimeError("database is closed")
        request = _Request(job)
        self._queue.put(request)
        return request.future

    def write_sync(self, job: Callable[[Conn], T]) -> T:
        """Run ``job`` in a write transaction; return once it is committed."""
        result: T = self.submit(job).result()
        return result

    async def write(self, job: Callable[[Conn], T]) -> T:
        result: T = await asyncio.wrap_future(self.submit(job))
        return result

    def on_task_change(self, listener: Callable[[str, str | None], None]) -> None:
        """Call ``listener(task_id, status)`` when another node changed a task. One
        SQLite database has one node: nothing to hear (PostgreSQL: :mod:`lmsp.store.pg`)."""

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (in the writer thread) after every commit."""
        self._listeners.append(listener)

    def _on_change(self, table: str) -> None:
        self._changed.add(table)
        self.versions.bump(table)

    def _settle_changes(self) -> None:
        """After a commit or rollback: the second bump (see :class:`Versions`)."""
        for table in self._changed:
            self.versions.bump(table)
        self._changed.clear()
        if self._tasks_changed:  # stamped after a rollback too: a harmless extra read
            self.versions.stamp_tasks(self._tasks_changed)
            self._tasks_changed.clear()

    def _writer(self) -> Any:
        """The writer's connection, opened again if it broke (PostgreSQL)."""
        return self._writer_conn

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            # a caller that stopped waiting (its asyncio task was cancelled) took its job
            # back: it is not run; every other future is running now, past cancelling
            batch = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if batch:
                self._commit_batch(self._writer(), batch)
            if stop:
                break
        self._writer_conn.close()

    def _commit_batch(
        self, conn: Any, batch: list[_Request], again: bool = False, tries: int = 0
    ) -> None:
        outcomes: list[tuple[_Request, bool, Any]] = []
        changes_before = conn.total_changes
        faults = self.faults
        began, cpu = time.perf_counter(), time.thread_time()
        appended: list[tuple[str, int, str, str]] = []
        conn.appended = appended
        try:
            before = [self.BEGIN]  # what must run before the next statement of ours
            for request in batch:
                self._control(conn, [*before, "SAVEPOINT job"])
                events_before = len(appended)
                try:
                    if faults is not None:
                        faults.job()
                    value = request.job(conn)
                except BaseException as exc:
                    if is_storage_error(exc):
                        raise _StorageFull(exc) from exc
                    if self._retryable(exc):  # a deadlock, say: the whole batch again
                        raise
                    self._control(conn, ["ROLLBACK TO job"])
                    del appended[events_before:]
                    outcomes.append((request, False, exc))
                else:
                    outcomes.append((request, True, value))
                before = ["RELEASE job"]
            if faults is not None:
                faults.commit()
            self._control(conn, [*before, "COMMIT"])
        except BaseException as exc:
            cause = exc.cause if isinstance(exc, _StorageFull) else exc
            full = is_storage_error(cause)
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except Exception:  # pragma: no cover - the database rolled back itself
                    log.exception("rollback failed")
            self._settle_changes()
            if not full and tries < RETRIES and self._retryable(cause):
                # nothing was answered yet: the whole batch runs again on a sound connection
                self._commit_batch(self._writer(), batch, again, tries + 1)
                return
            if full and not again and self._relieved():
                self._commit_batch(conn, batch, again=True)  # space was freed: once more
                return
            if full:
                log.warning("write transaction refused, the disk is full: %s", cause)
                self.health.failed()
            else:
                log.exception("write transaction failed")
            if self.metrics is not None:
                self.metrics.transaction_failed()
            answer = insufficient_storage() if full else cause
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(answer)
            return
        self.tail.publish(appended)  # before the stamps move: a woken follower finds them
        self._settle_changes()
        self.commits += 1
        self.jobs += len(batch)
        if self.metrics is not None:  # its time, and its CPU: the rest of its time it waited
            wall, used = time.perf_counter() - began, time.thread_time() - cpu
            self.metrics.transaction(len(batch), wall, len(appended), used)
        if conn.total_changes != changes_before:
            self.health.succeeded()
        for request, ok, value in outcomes:
            if ok:
                request.future.set_result(value)
            else:
                request.future.set_exception(value)
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # pragma: no cover - listeners must not break the writer
                log.exception("commit listener failed")

    def _relieved(self) -> bool:
        """Did :attr:`relief` free any space?"""
        relief = self.relief
        if relief is None:
            return False
        try:
            return relief() > 0
        except Exception:  # pragma: no cover - relief must not break the writer
            log.exception("relieving the disk failed")
            return False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        with self._readers_lock:
            for conn in self._readers:
                with contextlib.suppress(Exception):
                    conn.close()
            self._readers.clear()
        if self.lock is not None:
            self.lock.release()
