"""Idempotency keys: request digests and the result each key produced (PROTOCOL.md 7)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.store.sql import Conn, clock_sql


@dataclass(frozen=True)
class Key:
    client_id: str
    key: str
    digest: str
    ttl: float


@dataclass(frozen=True)
class Stored:
    status_code: int
    resource_id: str | None


def request_digest(method: str, path: str, body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = f"{method.upper()} {path}\n{canonical}"
    # surrogatepass: a digest for any parsed JSON, lone surrogates included
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def valid_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and all(33 <= ord(c) <= 126 for c in key)


def lookup(conn: Conn, key: Key) -> Stored | None:
    """The stored result for ``key``; 422 if the key was used for another request."""
    row = conn.execute(
        "SELECT request_digest, status_code, resource_id,"
        f" expires_at <= {clock_sql(conn)} AS expired FROM idempotency_keys"
        " WHERE client_id = ? AND key = ?",
        (key.client_id, key.key),
    ).fetchone()
    if row is None:
        return None
    if row["expired"]:  # by the database's clock, never a node's
        conn.execute(
            "DELETE FROM idempotency_keys WHERE client_id = ? AND key = ?", (key.client_id, key.key)
        )
        return None
    if row["request_digest"] != key.digest:
        raise LmspError(
            "idempotency_key_reused",
            "This Idempotency-Key was used with a different request.",
        )
    return Stored(int(row["status_code"]), row["resource_id"])


def record(conn: Conn, key: Key, status_code: int, resource_id: str | None) -> None:
    """Store a key; it expires ``ttl`` seconds from now by the database's clock (on a
    database nodes share, a node's clock never decides when another's key goes)."""
    clock = clock_sql(conn)
    conn.execute(
        "INSERT INTO idempotency_keys (client_id, key, request_digest, status_code, resource_id,"
        f" created_at, expires_at) VALUES (?, ?, ?, ?, ?, CAST({clock} AS BIGINT),"
        f" CAST({clock} + ? AS BIGINT))",
        (key.client_id, key.key, key.digest, status_code, resource_id, int(key.ttl)),
    )


def remember(conn: Conn, key: Key, resource_id: str, status_code: int = 200) -> bool:
    """Record a key for an idempotent POST; ``True`` when it was seen (a replay)."""
    if lookup(conn, key) is not None:
        return True
    record(conn, key, status_code, resource_id)
    return False
