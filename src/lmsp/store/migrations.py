"""SQLite's migrations: :mod:`lmsp.store.schema`'s steps, in SQLite's form, each once.

Each migration runs once, in its own ``BEGIN IMMEDIATE`` transaction together with the
row that records it in ``_migrations``; running :func:`migrate` again changes nothing.
The steps (both dialects, one list) are in :mod:`lmsp.store.schema`.
"""

from __future__ import annotations

import sqlite3
import time

from lmsp.store.schema import sqlite_migrations

#: (ledger id, SQL) of every step, oldest first
MIGRATIONS: list[tuple[str, str]] = sqlite_migrations()


def _ensure_ledger(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations ("
        " name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT"
    )


def applied(conn: sqlite3.Connection) -> list[str]:
    _ensure_ledger(conn)
    return [row[0] for row in conn.execute("SELECT name FROM _migrations ORDER BY name")]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now."""
    _ensure_ledger(conn)
    done: list[str] = []
    for name, sql in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone():
                conn.execute("ROLLBACK")
                continue
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, int(time.time()))
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        done.append(name)
    return done


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit on its own)."""
    parts: list[str] = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                parts.append(buf.strip())
            buf = ""
    if buf.strip():
        parts.append(buf.strip())
    return parts


def schema_version(conn: sqlite3.Connection) -> str | None:
    names = applied(conn)
    return names[-1] if names else None
