"""The connection contract the store's verbs are written against.

Two databases implement it: SQLite (``sqlite3``, the default, embedded) and PostgreSQL
(psycopg 3, :mod:`lmsp.store.pg`). A verb takes a :class:`Conn`, runs statements with
``?`` placeholders and reads :class:`Row`\\ s by name or by position; whatever differs
between the two dialects is asked of the connection (:attr:`Conn.dialect`) inside
``store/``, so nothing above the store knows which database is in use.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

SQLITE = "sqlite"
POSTGRES = "postgres"


class Row(Protocol):
    """A result row: ``row["name"]`` or ``row[0]``, its values in order when iterated
    (``sqlite3.Row`` and the PostgreSQL row of :mod:`lmsp.store.pg` both are one)."""

    def __getitem__(self, key: Any, /) -> Any: ...

    def keys(self) -> list[str]: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What a store verb needs of a connection."""

    #: ``"sqlite"`` or ``"postgres"``
    dialect: str
    #: appended to a ``SELECT`` that a write transaction acts upon: ``" FOR UPDATE"`` on
    #: a PostgreSQL writer (rows are not serialised by a database-wide write lock there),
    #: empty elsewhere (SQLite's ``BEGIN IMMEDIATE`` serialises every writer already)
    for_update: str

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> Cursor: ...


def where(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """`` WHERE a AND b`` of the conditions whose value is given, and their arguments in
    order (``""`` and none when no value is). A condition is its SQL and its value: None
    leaves it out (a filter not asked for), a tuple fills several placeholders."""
    given = [(sql, value) for sql, value in conditions if value is not None]
    args = [v for _, value in given for v in (value if isinstance(value, tuple) else (value,))]
    return (f" WHERE {' AND '.join(sql for sql, _ in given)}" if given else ""), args


def clock_sql(conn: Conn) -> str:
    """An SQL expression for the database's clock in seconds since the epoch (a float):
    leases are judged by one clock, the database's, never a node's."""
    if conn.dialect == POSTGRES:
        return "extract(epoch from clock_timestamp())::float8"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def clock_now(conn: Conn) -> int:
    """The time to stamp a row with, in whole seconds: the database's clock on a database
    nodes share (one clock for every node's stamps, which retention ages by), this
    machine's on SQLite (the database's clock is this machine's there)."""
    if conn.dialect == POSTGRES:
        return int(conn.execute(f"SELECT {clock_sql(conn)}").fetchone()[0])
    return int(time.time())


def skip_locked(conn: Conn) -> str:
    """What makes a claim's ``SELECT`` pass over rows another node is claiming."""
    return " FOR UPDATE SKIP LOCKED" if conn.dialect == POSTGRES else ""
