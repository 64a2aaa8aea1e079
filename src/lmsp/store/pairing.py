"""Pairing requests: the device flow of PROTOCOL.md section 2.

A request is ``pending`` until an operator approves or denies it; an approved request
is claimed exactly once, and the claim creates the client with its token in the same
transaction. A request past ``expires_at`` can no longer be decided or claimed.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from typing import Any

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.store import clients
from lmsp.store.sql import Conn, Row, clock_sql

# consonants only: no words, no 0/O or 1/I confusion; 20^8 codes
CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
POLL_INTERVAL = 2
# expired requests are kept this long (polls answer ``expired_token``), then swept
GRACE = 3600


def new_user_code() -> str:
    chars = "".join(secrets.choice(CODE_ALPHABET) for _ in range(8))
    return f"{chars[:4]}-{chars[4:]}"


def normalize_code(text: str) -> str:
    raw = "".join(ch for ch in text.upper() if ch.isalnum())
    return f"{raw[:4]}-{raw[4:]}" if len(raw) == 8 else text


def get(conn: Conn, ident: str) -> Row | None:
    """A request by id or by user code (any case, with or without the dash)."""
    row: Row | None = conn.execute(
        "SELECT * FROM pairing_requests WHERE id = ? OR user_code = ?",
        (ident, normalize_code(ident)),
    ).fetchone()
    return row


def pending(conn: Conn, now: int) -> list[Row]:
    return list(
        conn.execute(
            "SELECT * FROM pairing_requests WHERE status = 'pending' AND expires_at > ?"
            " ORDER BY created_at, id",
            (now,),
        )
    )


def same_name(a: str, b: str) -> bool:
    """Whether two client names count as one for the per-name limit (case and
    surrounding spaces aside)."""
    return a.strip().casefold() == b.strip().casefold()


def _refuse(waiting: list[Row], now: int, message: str) -> LmspError:
    retry = max(1, min(r["expires_at"] for r in waiting) - now)
    return LmspError("too_many_pairing_requests", message, headers={"Retry-After": str(retry)})


def create(
    conn: Conn,
    *,
    client_name: str,
    scopes: list[str],
    ttl: int,
    max_pending: int,
    now: int,
    source: str = "",
    max_per_source: int | None = None,
    max_per_name: int | None = None,
    max_remote: int | None = None,
) -> Row:
    """A new pending request; ``429`` (with ``Retry-After``: when the oldest of those
    it counts against expires) when ``max_per_name`` unexpired ones with the same
    client name, ``max_per_source`` from the same ``source`` (the caller passes it only
    for a peer it can tell apart: not loopback, where every local agent is one
    address), ``max_remote`` from peers beyond this machine together (the caller passes
    it for such a peer: hosts elsewhere can never take every slot from this machine's
    agents), or ``max_pending`` in all are waiting."""
    waiting = pending(conn, now)
    limits = (  # the requests a limit counts, the limit, which requests it says
        (
            [r for r in waiting if same_name(r["client_name"], client_name)],
            max_per_name,
            f" named {client_name.strip()!r}",
        ),
        ([r for r in waiting if r["source"] == source], max_per_source, " from this address"),
        (
            [r for r in waiting if is_remote(r["source"] or "")],
            max_remote,
            " from beyond this machine",
        ),
        (waiting, max_pending, ""),
    )
    for counted, limit, which in limits:
        if limit is not None and len(counted) >= limit:
            said = f"{limit} pairing requests{which} are waiting for approval already"
            raise _refuse(counted, now, f"{said}; retry later.")
    code = new_user_code()
    while conn.execute("SELECT 1 FROM pairing_requests WHERE user_code = ?", (code,)).fetchone():
        code = new_user_code()
    pair_id = new_id("pair")
    conn.execute(
        "INSERT INTO pairing_requests (id, user_code, client_name, scopes, status, created_at,"
        " expires_at, source) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?)",
        (pair_id, code, client_name, json.dumps(scopes), now, now + ttl, source),
    )
    row = get(conn, pair_id)
    assert row is not None
    return row


def is_remote(source: str) -> bool:
    """Is ``source`` (a peer's address) an address beyond this machine?"""
    try:
        return not ipaddress.ip_address(source).is_loopback
    except ValueError:
        return False  # no address (a Unix socket, an in-process test client)


def deny_pending(conn: Conn, now: int, source: str | None = None) -> list[str]:
    """Deny every pending request (only those of ``source``, if given): the operator
    clearing the slots. Returns the ids denied; their polls answer ``access_denied``."""
    ids = [r["id"] for r in pending(conn, now) if source is None or r["source"] == source]
    for pair_id in ids:
        conn.execute(
            "UPDATE pairing_requests SET status = 'denied', decided_at = ?"
            " WHERE id = ? AND status = 'pending'",
            (now, pair_id),
        )
    return ids


def _narrow(requested: list[str], granted: list[str] | None) -> list[str]:
    if granted is None:
        return requested
    if "admin" not in requested:
        extra = [s for s in granted if s not in requested]
        if extra:
            raise LmspError(
                "invalid_scope",
                f"Scope {extra[0]!r} was not requested; approve with fewer scopes only.",
                param="scopes",
            )
    if not granted:
        raise LmspError("invalid_scope", "Grant at least one scope.", param="scopes")
    return granted


def decide(conn: Conn, ident: str, *, approve: bool, scopes: list[str] | None, now: int) -> Row:
    """Approve (possibly with fewer scopes) or deny a pending, unexpired request."""
    row = get(conn, ident)
    if row is None:
        raise LmspError("not_found", f"No pairing request {ident!r}.")
    if row["status"] != "pending":
        raise LmspError("pairing_not_pending", f"The pairing request is {row['status']} already.")
    if row["expires_at"] <= now:
        raise LmspError("pairing_expired", "The pairing request has expired.")
    granted = _narrow(json.loads(row["scopes"]), scopes) if approve else None
    conn.execute(
        "UPDATE pairing_requests SET status = ?, granted_scopes = ?, decided_at = ?"
        " WHERE id = ? AND status = 'pending'",
        (
            "approved" if approve else "denied",
            None if granted is None else json.dumps(granted),
            now,
            row["id"],
        ),
    )
    decided = get(conn, row["id"])
    assert decided is not None
    return decided


def _poll_error(code: str, message: str) -> LmspError:
    return LmspError(code, message)


def claim(conn: Conn, pair_id: str, now: int) -> dict[str, Any]:
    """The token of an approved request, exactly once; the client is created here."""
    row = conn.execute("SELECT * FROM pairing_requests WHERE id = ?", (pair_id,)).fetchone()
    if row is None:
        raise LmspError("not_found", f"No pairing request {pair_id!r}.")
    if row["status"] == "claimed":
        raise _poll_error("already_claimed", "The token of this request was handed out already.")
    if row["status"] == "denied":
        raise _poll_error("access_denied", "The operator denied this pairing request.")
    if row["expires_at"] <= now:
        raise _poll_error("expired_token", "The pairing request has expired; start again.")
    if row["status"] == "pending":
        raise _poll_error("authorization_pending", "Waiting for the operator to approve.")
    scopes: list[str] = json.loads(row["granted_scopes"])
    client, token = clients.add(conn, row["client_name"], scopes)
    cur = conn.execute(
        "UPDATE pairing_requests SET status = 'claimed', client_id = ?, claimed_at = ?"
        " WHERE id = ? AND status = 'approved'",
        (client.id, now, pair_id),
    )
    if cur.rowcount != 1:  # pragma: no cover - the writer runs one job at a time
        raise _poll_error("already_claimed", "The token of this request was handed out already.")
    return {"client_id": client.id, "token": token, "scopes": scopes}


def render(row: Row) -> dict[str, Any]:
    granted = row["granted_scopes"]
    return {
        "id": row["id"],
        "object": "pairing_request",
        "user_code": row["user_code"],
        "client_name": row["client_name"],
        "scopes": json.loads(row["scopes"]),
        "granted_scopes": None if granted is None else json.loads(granted),
        "status": row["status"],
        "source": row["source"] or None,
        "client_id": row["client_id"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "interval": POLL_INTERVAL,
    }


def delete_expired_batch(conn: Conn, batch: int) -> int:
    """Delete up to ``batch`` requests that expired more than ``GRACE`` seconds ago (by
    the database's clock)."""
    cur = conn.execute(
        "DELETE FROM pairing_requests WHERE id IN ("
        " SELECT id FROM pairing_requests"
        f" WHERE expires_at <= {clock_sql(conn)} - ? ORDER BY expires_at LIMIT ?)",
        (GRACE, batch),
    )
    return cur.rowcount
