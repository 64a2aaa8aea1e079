"""The reads ``lmsp doctor`` makes of a database, on either store."""

from __future__ import annotations

import time

from lmsp.store import nodes
from lmsp.store.sql import POSTGRES, Conn, Row


def integrity(conn: Conn) -> list[str]:
    """SQLite's own page check (``["ok"]`` when sound); PostgreSQL checks its pages
    itself, and answering at all is what can be checked from here."""
    if conn.dialect == POSTGRES:
        return ["ok"] if conn.execute("SELECT 1").fetchone() is not None else ["no answer"]
    return [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]


def applied_migrations(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]


def model_rows(conn: Conn) -> list[Row]:
    return list(conn.execute("SELECT id, digest, size_bytes FROM models ORDER BY position, id"))


def owner_row(conn: Conn) -> Row | None:
    row: Row | None = conn.execute(
        "SELECT c.token_hash, c.revoked_at FROM clients c JOIN service_config s"
        " ON s.key = 'owner_client_id' AND s.value = c.id"
    ).fetchone()
    return row


def clock_skew(conn: Conn) -> float:
    """The database's clock minus this machine's, in seconds (the round trip halved)."""
    before = time.time()
    skew = nodes.clock_skew(conn, before)
    half_trip = (time.time() - before) / 2
    return skew - half_trip


def node_rows(conn: Conn) -> list[Row]:
    return nodes.all_nodes(conn)


def server_version(conn: Conn) -> str:
    """PostgreSQL's version (SQLite's library version on SQLite)."""
    if conn.dialect == POSTGRES:
        row = conn.execute("SHOW server_version").fetchone()
    else:
        row = conn.execute("SELECT sqlite_version()").fetchone()
    return str(row[0]) if row else "?"
