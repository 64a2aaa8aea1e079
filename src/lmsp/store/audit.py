"""The audit log (PROTOCOL.md 13): every owner or admin action, append-only.

A row is ``(id, at, actor, action, target, change)`` and two hashes: ``prev_hash``, the
hash of the row before (64 zeros for the first), and ``hash``, the SHA-256 of
``prev_hash`` and the row's own fields in canonical JSON. Editing, deleting or
reordering a row breaks the chain from there on; :func:`verify` names the first row
that does not hold (``lmsp doctor``). The tables refuse ``UPDATE`` and ``DELETE``
(triggers), so only someone editing the database by hand can break it.

:func:`record` is the one way in, for every feature that changes what the owner
controls: call it with the connection of the transaction that makes the change, so the
change and its record commit together.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lmsp.ids import now as _now
from lmsp.store.sql import POSTGRES, Conn, Row, where

GENESIS = "0" * 64
#: the advisory lock that orders appends from several PostgreSQL nodes ("lmsa")
CHAIN_LOCK = 0x6C6D7361


def _digest(
    prev_hash: str, row_id: int, at: int, actor: str, action: str, target: str, change: str
) -> str:
    canonical = json.dumps(
        [prev_hash, row_id, at, actor, action, target, change],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def record(
    conn: Conn, actor: str, action: str, target: str, change: dict[str, Any] | None = None
) -> int:
    """Append one row: ``actor`` (a client id, or ``cli``/``console:…``), ``action``
    (``client.created``, ``client.limits_changed`` …), ``target`` (what it acted on),
    ``change`` (what changed, JSON). Returns the row's id."""
    if conn.dialect == POSTGRES:  # one writer at a time extends the chain
        conn.execute("SELECT pg_advisory_xact_lock(?)", (CHAIN_LOCK,))
    last = conn.execute("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
    row_id = 1 if last is None else int(last["id"]) + 1
    prev_hash = GENESIS if last is None else str(last["hash"])
    at = _now()
    text = json.dumps(change or {}, sort_keys=True, separators=(",", ":"))
    conn.execute(
        "INSERT INTO audit_log (id, at, actor, action, target, change, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            row_id,
            at,
            actor,
            action,
            target,
            text,
            prev_hash,
            _digest(prev_hash, row_id, at, actor, action, target, text),
        ),
    )
    return row_id


def render(row: Row) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "object": "audit_entry",
        "at": int(row["at"]),
        "actor": row["actor"],
        "action": row["action"],
        "target": row["target"],
        "change": json.loads(row["change"]),
        "prev_hash": row["prev_hash"],
        "hash": row["hash"],
    }


def page(
    conn: Conn,
    *,
    after: int | None = None,
    limit: int = 100,
    target: str | None = None,
    action: str | None = None,
) -> list[Row]:
    """Rows oldest first, after the id ``after``, of one target or action if given."""
    clause, args = where(("id > ?", after or 0), ("target = ?", target), ("action = ?", action))
    return list(
        conn.execute(f"SELECT * FROM audit_log{clause} ORDER BY id LIMIT ?", (*args, limit))
    )


def verify(conn: Conn) -> tuple[int, int | None, str]:
    """Walk the chain: ``(rows checked, id of the first broken row or None, why)``."""
    expected_prev = GENESIS
    expected_id = 1
    count = 0
    for row in conn.execute("SELECT * FROM audit_log ORDER BY id"):
        row_id = int(row["id"])
        if row_id != expected_id:
            return count, row_id, f"row {expected_id} is missing"
        if row["prev_hash"] != expected_prev:
            return count, row_id, "its prev_hash is not the hash of the row before"
        wanted = _digest(
            row["prev_hash"],
            row_id,
            int(row["at"]),
            row["actor"],
            row["action"],
            row["target"],
            row["change"],
        )
        if wanted != row["hash"]:
            return count, row_id, "its content does not match its hash (edited)"
        expected_prev = row["hash"]
        expected_id += 1
        count += 1
    return count, None, ""
