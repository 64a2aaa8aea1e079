"""PostgreSQL's migrations: :mod:`lmsp.store.schema`'s steps, in PostgreSQL's form, as
:mod:`lmsp.store.migrations` applies them to SQLite.

``p001_schema`` is steps 1 to 8 (``m001`` … ``m008``) run together; later steps are one
migration each (``p009_nodes`` is ``m009_nodes``). Each migration runs in one
transaction under an advisory lock, so nodes starting together apply it once.

Triggers turn every change of a task (its row, its event log) and of a watched client
column into a ``NOTIFY`` on :data:`TASKS_CHANNEL` or :data:`CLIENTS_CHANNEL`: delivered
at commit to every node, it wakes streams, reaches a generating node with a cancel, and
expires token caches (:mod:`lmsp.store.pg`).
"""

from __future__ import annotations

import time
from typing import Any

from lmsp.store.schema import postgres_migrations

#: the advisory lock id migrations hold ("lmsp" in ASCII)
LOCK_ID = 0x6C6D7370

TASKS_CHANNEL = "lmsp_tasks"
CLIENTS_CHANNEL = "lmsp_clients"

#: (ledger id, SQL) of every migration, oldest first
MIGRATIONS: list[tuple[str, str]] = postgres_migrations()


def migrate(raw: Any) -> list[str]:
    """Apply every migration not yet recorded on a psycopg connection in autocommit
    mode; return the names applied now."""
    done: list[str] = []
    for name, sql in MIGRATIONS:
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
            raw.execute(
                "CREATE TABLE IF NOT EXISTS _migrations ("
                " name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)"
            )
            if raw.execute("SELECT 1 FROM _migrations WHERE name = %s", (name,)).fetchone():
                continue
            raw.execute(sql)
            raw.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (%s, %s)",
                (name, int(time.time())),
            )
        done.append(name)
    return done
