"""``service_config``: the service's identity, settings and keys kept across restarts
(in the database: every node sharing it reads the same)."""

from __future__ import annotations

import secrets

from lmsp.ids import new_id
from lmsp.store.sql import Conn


def get(conn: Conn, key: str) -> str | None:
    row = conn.execute("SELECT value FROM service_config WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def put(conn: Conn, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO service_config (key, value) VALUES (?, ?)"
        " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def ensure_identity(conn: Conn) -> str:
    """The service id, created once on first start."""
    current = get(conn, "service_id")
    if current is None:
        current = new_id("svc")
        put(conn, "service_id", current)
    return current


#: the key of the HMAC that compaction items carry (lmsp.protocol.compaction)
COMPACTION_KEY = "compaction_key"


def ensure_secret(conn: Conn, key: str) -> str:
    """The random secret stored under ``key`` (32 bytes, hex), created by the first
    start that needs it; nodes starting together on a shared database agree on one
    (the first insert wins, the others read it)."""
    current = get(conn, key)
    if current is None:
        conn.execute(
            "INSERT INTO service_config (key, value) VALUES (?, ?) ON CONFLICT(key) DO NOTHING",
            (key, secrets.token_hex(32)),
        )
        current = get(conn, key)
    assert current is not None
    return current


def compaction_key(conn: Conn) -> bytes:
    return bytes.fromhex(ensure_secret(conn, COMPACTION_KEY))
