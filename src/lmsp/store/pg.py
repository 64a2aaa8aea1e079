"""The PostgreSQL store: the same verbs and the same group-commit writer as SQLite, on a
database that several lmsp nodes share (``LMSP_DATABASE_URL=postgresql://…``).

:class:`PgConnection` gives the verbs what :class:`lmsp.store.sql.Conn` promises: ``?``
placeholders (translated to psycopg's), rows read by name or position, and
``for_update`` on the writer's connection: a write that reads a task before acting on
it locks that row, as SQLite's ``BEGIN IMMEDIATE`` serialises every writer.

:class:`PgDatabase` is :class:`lmsp.store.db.Database` with PostgreSQL connections:
readers lent by psycopg's pool (bounded; one to a thread while it lives; each read in
autocommit sees the latest commit, as SQLite's readers do), one writer that batches jobs
into one transaction (a batch that hits a serialization failure or a deadlock with
another node's runs again), and a listener.
Every commit on any node that changes a task or a client ``NOTIFY``\\ s (triggers in
:mod:`lmsp.store.pg_schema`); the notification is only a wake-up (streams read the
log from the table): it stamps the task in :attr:`Database.versions`, bumps the
``clients`` version (token caches drop what they hold), and calls the commit listeners
(the broker) and the task listeners (a generating node learns of a cancel made on
another). The writer listens too, so its own commits are stamped before they are
answered, as the SQLite triggers do.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from lmsp.store import pg_schema
from lmsp.store.db import Database
from lmsp.store.sql import POSTGRES

if TYPE_CHECKING:
    from lmsp.datadir import DataDirLock

log = logging.getLogger(__name__)

#: the longest a writer's transaction may sit idle (its node paused, say) before the
#: server ends its session and frees the rows it locked; well under any lease
IDLE_IN_TRANSACTION = 5.0
#: SQLSTATEs after which a batch runs again: serialization failure, deadlock
RETRY_STATES = frozenset({"40001", "40P01"})
#: reader connections a node holds at most (each thread that reads keeps one while it
#: lives; the API's readers, the runners and the housekeeping threads are about a dozen);
#: with the writer and the listener, a node opens at most this many plus two
READER_CONNECTIONS = 24
#: how long a reading thread waits for a connection when all are taken
READER_WAIT = 30.0


class PgRow(tuple[Any, ...]):
    """A row readable as ``row["name"]`` and ``row[0]``, like ``sqlite3.Row``."""

    __slots__ = ()
    _names: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[PgRow]:
    index = {name: i for i, name in enumerate(names)}
    return type("PgRow", (PgRow,), {"__slots__": (), "_names": index})


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Any]:
    """psycopg's row factory: rows of the cursor's columns."""
    description = cursor.description
    if description is None:
        return tuple
    return _row_class(tuple(column.name for column in description))


@functools.lru_cache(maxsize=4096)
def translate(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def raw_connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection whose rows are :class:`PgRow`."""
    return psycopg.connect(url, autocommit=True, row_factory=_rows)


def _reader_pool(url: str, size: int) -> ConnectionPool[psycopg.Connection[Any]]:
    """psycopg's pool of reader connections (autocommit, :class:`PgRow` rows): bounded,
    checked when lent, and a broken one given back is replaced."""
    return ConnectionPool(
        url,
        min_size=1,
        max_size=size,
        kwargs={"autocommit": True, "row_factory": _rows},
        check=ConnectionPool.check_connection,
        timeout=READER_WAIT,
        name="lmsp-readers",
        open=True,
    )


class _Lent:
    """A reader connection lent to one thread: given back to the pool when the thread
    ends (its thread-local state is dropped) or when it broke."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        raw = pool.getconn()
        self.conn = PgConnection(raw)
        self._give_back = weakref.finalize(self, _give_back, pool, raw)

    def give_back(self) -> None:
        self._give_back()


def _give_back(pool: ConnectionPool[psycopg.Connection[Any]], raw: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):  # a closed pool closes it
        pool.putconn(raw)


class PgConnection:
    """A psycopg connection speaking the store's contract (:class:`lmsp.store.sql.Conn`)."""

    dialect = POSTGRES

    def __init__(self, raw: psycopg.Connection[Any], *, writer: bool = False) -> None:
        self.raw = raw
        self.for_update = " FOR UPDATE" if writer else ""
        #: the writer's: events appended in the open transaction (store/tail.py)
        self.appended: list[tuple[str, int, str, str]] | None = None
        self.total_changes = 0  # rows changed since opened, as sqlite3's

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        cursor = self.raw.execute(translate(sql), tuple(parameters))
        if cursor.rowcount > 0 and cursor.description is None:
            self.total_changes += cursor.rowcount
        return cursor

    def executemany(
        self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /
    ) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        cursor.executemany(translate(sql), list(seq_of_parameters))
        if cursor.rowcount > 0:
            self.total_changes += cursor.rowcount
        return cursor

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != TransactionStatus.IDLE

    @property
    def broken(self) -> bool:
        return self.raw.closed or self.raw.broken

    def close(self) -> None:
        self.raw.close()


TaskListener = Callable[[str, str | None], None]


class PgDatabase(Database):
    """The store on PostgreSQL: readers, the group-commit writer and the listener."""

    BEGIN = "BEGIN"
    dialect = POSTGRES
    shared = True

    def __init__(
        self,
        url: str,
        lock: DataDirLock | None = None,
        *,
        idle_in_transaction: float = IDLE_IN_TRANSACTION,
        readers: int = READER_CONNECTIONS,
    ) -> None:
        self.url = url
        self.path = Path("postgresql")  # nothing on disk: for messages only
        self.idle_in_transaction = idle_in_transaction
        raw = raw_connect(url)
        try:
            pg_schema.migrate(raw)
        finally:
            raw.close()
        self._pool = _reader_pool(url, readers)
        self._task_listeners: list[TaskListener] = []
        self._start(self._open_writer(), lock)
        self._listening = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="lmsp-listen", daemon=True)
        self._listener.start()
        self._listening.wait(10)
        self._thread.start()

    # -- connections ------------------------------------------------------------------------
    def _open_writer(self) -> PgConnection:
        raw = raw_connect(self.url)
        timeout = max(1, int(self.idle_in_transaction * 1000))
        raw.execute(f"SET idle_in_transaction_session_timeout = {timeout}")
        raw.execute(f"LISTEN {pg_schema.TASKS_CHANNEL}")
        raw.execute(f"LISTEN {pg_schema.CLIENTS_CHANNEL}")
        raw.add_notify_handler(self._own_notify)
        return PgConnection(raw, writer=True)

    def _writer(self) -> PgConnection:
        conn: PgConnection = self._writer_conn
        if conn.broken:
            log.warning("the database connection of the writer broke; opening another")
            conn.close()
            while True:
                try:
                    conn = self._open_writer()
                    break
                except psycopg.OperationalError as exc:
                    if self._closed:
                        raise
                    log.warning("cannot reach the database: %s", exc)
                    time.sleep(0.5)
            self._writer_conn = conn
        return conn

    def reader(self) -> PgConnection:
        """This thread's reader connection, lent by the pool for as long as the thread
        lives (a broken one is given back and another lent)."""
        lent: _Lent | None = getattr(self._local, "lent", None)
        if lent is None or lent.conn.broken:
            if lent is not None:
                lent.give_back()
            lent = _Lent(self._pool)
            self._local.lent = lent
        return lent.conn

    def _control(self, conn: Any, statements: list[str]) -> None:
        """The writer's transaction control statements in one round trip (the simple
        query protocol runs them in order and stops at the first that fails): a job in
        a batch costs one for its savepoint, not two."""
        conn.raw.execute("; ".join(statements))

    def _retryable(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) in RETRY_STATES

    # -- notifications ----------------------------------------------------------------------
    def on_task_change(self, listener: TaskListener) -> None:
        """Call ``listener(task_id, status)`` (in the listener thread) when a task's row
        or log changed on any node; ``status`` is the row's new one, ``None`` for an
        event appended."""
        self._task_listeners.append(listener)

    def _own_notify(self, notify: psycopg.Notify) -> None:
        """A notification of the writer's own commit, received with the ``COMMIT``:
        the changes are stamped before any job of it is answered."""
        if notify.channel == pg_schema.CLIENTS_CHANNEL:
            self._on_change("clients")
        else:
            self._tasks_changed.add(notify.payload.split(" ", 1)[0])

    def _listen(self) -> None:
        """Every node's commits, as they happen: stamp, bump and wake."""
        while not self._closed:
            try:
                raw = raw_connect(self.url)
            except psycopg.OperationalError as exc:
                log.warning("cannot listen to the database: %s", exc)
                time.sleep(0.5)
                continue
            try:
                raw.execute(f"LISTEN {pg_schema.TASKS_CHANNEL}")
                raw.execute(f"LISTEN {pg_schema.CLIENTS_CHANNEL}")
                self._listening.set()
                while not self._closed:
                    self._dispatch(list(raw.notifies(timeout=0.5)))
            except psycopg.Error as exc:
                if not self._closed:
                    log.warning("listening to the database failed: %s", exc)
                    time.sleep(0.2)
            finally:
                raw.close()

    def _dispatch(self, notifies: list[psycopg.Notify]) -> None:
        if not notifies:
            return
        tasks: dict[str, str | None] = {}
        clients = False
        for notify in notifies:
            if notify.channel == pg_schema.CLIENTS_CHANNEL:
                clients = True
                continue
            task_id, _, status = notify.payload.partition(" ")
            if status:
                tasks[task_id] = status
            else:
                tasks.setdefault(task_id, None)
        if clients:
            self.versions.bump("clients")
            self.versions.bump("clients")
        if tasks:
            self.versions.stamp_tasks(set(tasks))
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # pragma: no cover - listeners must not stop listening
                log.exception("commit listener failed")
        for changed, new_status in tasks.items():
            for task_listener in self._task_listeners:
                try:
                    task_listener(changed, new_status)
                except Exception:  # pragma: no cover
                    log.exception("task listener failed")

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._listener.join(timeout=5)
        self._pool.close()
