"""``service_config``: the service's identity and settings kept across restarts."""

from __future__ import annotations

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
