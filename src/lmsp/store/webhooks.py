"""Webhooks and their transactional outbox (PROTOCOL.md section 9).

A webhook belongs to a client and hears that client's responses end (an ``admin``
client's webhook may ask for every client's: ``all_clients``). When a task reaches a
terminal state, :func:`enqueue` runs inside that same transaction (one call from the
terminal branch of :func:`lmsp.store.tasks.move`) and writes one delivery row per
webhook that asked for the event: the event and the state commit together or not at
all, so a crash never loses one nor announces an end that did not happen.

A delivery is ``pending`` until a sender's try is answered 2xx (``delivered``) or its
time runs out (``failed``). Senders take due rows with :func:`claim`: one conditional
``UPDATE`` over rows chosen with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so nodes
claiming at once pass over each other's rows; the claim sets a token, the claiming
node and a lease (``next_attempt_at`` moves past the try's longest time), so a node
that dies mid-try leaves a row that falls due again when its lease ends.
:func:`settle` records a try's outcome only under the claim it was made with.

The secret: Standard Webhooks signs with HMAC-SHA256, so the server needs the key
itself, not a hash of it. It is kept in the ``webhooks`` row (the database is the
user's alone: mode 0600 in the data directory, or the PostgreSQL database the
operator secures) and shown to the client when the webhook is created and when its
secret is replaced (:func:`rotate`); no read ever returns it.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.ids import now as _now
from lmsp.protocol.records import TaskRecord
from lmsp.store.sql import Conn, Row, clock_sql, skip_locked, where

#: webhooks one client may have
MAX_PER_CLIENT = 32
#: the secret's random bytes (Standard Webhooks: 24 to 64)
SECRET_BYTES = 32
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and the key in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


# -- webhooks ---------------------------------------------------------------------------------


def add(
    conn: Conn,
    client_id: str,
    url: str,
    events: Sequence[str],
    description: str | None,
    all_clients: bool,
) -> tuple[Row, str]:
    """Store a webhook; returns its row and its secret (shown this once)."""
    count = conn.execute("SELECT count(*) FROM webhooks WHERE client_id = ?", (client_id,))
    if int(count.fetchone()[0]) >= MAX_PER_CLIENT:
        raise LmspError(
            "too_many_webhooks", f"A client may have at most {MAX_PER_CLIENT} webhooks."
        )
    webhook_id = new_id("wh")
    secret = new_secret()
    stamp = _now()
    conn.execute(
        "INSERT INTO webhooks (id, client_id, url, events, description, all_clients, secret,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            webhook_id,
            client_id,
            url,
            json.dumps(list(events)),
            description,
            1 if all_clients else 0,
            secret,
            stamp,
            stamp,
        ),
    )
    row = get(conn, webhook_id)
    assert row is not None
    return row, secret


def get(conn: Conn, webhook_id: str) -> Row | None:
    row: Row | None = conn.execute("SELECT * FROM webhooks WHERE id = ?", (webhook_id,)).fetchone()
    return row


def listed(conn: Conn, client_id: str | None) -> list[Row]:
    """A client's webhooks (``None``: every client's), oldest first."""
    if client_id is None:
        return list(conn.execute("SELECT * FROM webhooks ORDER BY created_at, id"))
    return list(
        conn.execute(
            "SELECT * FROM webhooks WHERE client_id = ? ORDER BY created_at, id", (client_id,)
        )
    )


def update(
    conn: Conn,
    webhook_id: str,
    *,
    url: str | None = None,
    events: Sequence[str] | None = None,
    description: str | None = None,
) -> tuple[Row, dict[str, Any]] | None:
    """Change a webhook's URL, events or description (``None``: keep it); returns its
    row and what changed (empty: nothing did, and ``updated_at`` stays), or ``None`` if
    there is no such webhook. Pending deliveries go to the new URL; events already in
    the outbox are still sent, whatever the new events."""
    row = get(conn, webhook_id)
    if row is None:
        return None
    wanted = {
        "url": url,
        "events": None if events is None else json.dumps(list(events)),
        "description": description,
    }
    columns = {k: v for k, v in wanted.items() if v is not None and v != row[k]}
    if not columns:
        return row, {}
    sets = ", ".join(f"{column} = ?" for column in columns)
    if not conn.execute(
        f"UPDATE webhooks SET {sets}, updated_at = ? WHERE id = ?",
        (*columns.values(), _now(), webhook_id),
    ).rowcount:
        return None
    change: dict[str, Any] = dict(columns)
    if "events" in change:
        change["events"] = list(events or ())
    fresh = get(conn, webhook_id)
    assert fresh is not None
    return fresh, change


def rotate(conn: Conn, webhook_id: str) -> tuple[Row, str] | None:
    """A new secret for a webhook (``None``: no such webhook); the old one signs nothing
    from this commit on (every try reads the secret when it is claimed)."""
    secret = new_secret()
    if not conn.execute(
        "UPDATE webhooks SET secret = ?, updated_at = ? WHERE id = ?",
        (secret, _now(), webhook_id),
    ).rowcount:
        return None
    row = get(conn, webhook_id)
    assert row is not None
    return row, secret


def newest_first(conn: Conn, client_id: str | None, after: Row | None, limit: int) -> list[Row]:
    """A client's webhooks (``None``: every client's), newest first (``created_at`` is
    in seconds: ties in id order), those after the webhook ``after`` (a cursor); at
    most ``limit``."""
    cursor = None if after is None else (after["created_at"], after["created_at"], after["id"])
    clause, args = where(
        ("client_id = ?", client_id),
        ("(created_at < ? OR (created_at = ? AND id < ?))", cursor),
    )
    return list(
        conn.execute(
            f"SELECT * FROM webhooks{clause} ORDER BY created_at DESC, id DESC LIMIT ?",
            (*args, limit),
        )
    )


def delete(conn: Conn, webhook_id: str) -> bool:
    """Remove a webhook; its deliveries go with it (pending ones are not sent)."""
    return conn.execute("DELETE FROM webhooks WHERE id = ?", (webhook_id,)).rowcount > 0


def count(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) FROM webhooks").fetchone()[0])


def render(row: Row, *, with_client: bool = False) -> dict[str, Any]:
    """The webhook object (never its secret)."""
    obj: dict[str, Any] = {
        "id": row["id"],
        "object": "webhook",
        "url": row["url"],
        "events": json.loads(row["events"]),
        "description": row["description"],
        "all_clients": bool(row["all_clients"]),
        "created_at": int(row["created_at"]),
    }
    if with_client:
        obj["client_id"] = row["client_id"]
    return obj


# -- the outbox -------------------------------------------------------------------------------


def enqueue(conn: Conn, task: TaskRecord, event_type: str) -> int:
    """In the transaction that moved ``task`` to a terminal state: a delivery of the
    event to each webhook of the task's client (and each ``all_clients`` one) that asked
    for ``event_type``, under one event id. Returns how many."""
    targets = [
        row[0]
        for row in conn.execute(
            "SELECT w.id, w.events FROM webhooks w JOIN clients c ON c.id = w.client_id"
            " WHERE (w.client_id = ? OR w.all_clients = 1) AND c.revoked_at IS NULL",
            (task.client_id,),
        )
        if event_type in json.loads(row[1])
    ]
    if not targets:
        return 0
    event_id = new_id("evt")
    stamp = time.time()
    conn.executemany(
        "INSERT INTO webhook_deliveries (event_id, webhook_id, type, response_id, client_id,"
        " created_at, status, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
        [
            (event_id, target, event_type, task.response_id, task.client_id, stamp, stamp)
            for target in targets
        ],
    )
    return len(targets)


@dataclass(frozen=True)
class Claimed:
    """A delivery a sender holds: what to send, where, signed with what."""

    seq: int
    claim: str
    event_id: str
    type: str
    response_id: str
    created_at: float
    attempts: int  # tries so far, this one included
    webhook_id: str
    owner: str  # the client that owns the webhook
    url: str
    secret: str


@dataclass(frozen=True)
class Due:
    """A due delivery: its row, its webhook and the client that owns the webhook (the
    one whose receiver it is)."""

    seq: int
    webhook_id: str
    owner: str


def due(conn: Conn, now: float, per_webhook: int, per_owner: int, limit: int) -> list[Due]:
    """Due deliveries, fair between the clients that own the webhooks: at most
    ``per_webhook`` of any one webhook and ``per_owner`` of any one client, taken in
    turns — every client's first, then every client's second, … (within a client, each
    webhook's oldest before any webhook's second; oldest first within a turn) — at most
    ``limit``. A client whose receivers have a backlog, or never answer, does not crowd
    another client's deliveries out of the list."""
    return [
        Due(int(r[0]), str(r[1]), str(r[2]))
        for r in conn.execute(
            "SELECT seq, webhook_id, owner FROM ("
            " SELECT seq, webhook_id, owner, next_attempt_at, row_number() OVER"
            " (PARTITION BY owner ORDER BY n, next_attempt_at, seq) AS turn FROM ("
            "  SELECT d.seq, d.webhook_id, w.client_id AS owner, d.next_attempt_at,"
            "  row_number() OVER (PARTITION BY d.webhook_id ORDER BY d.next_attempt_at, d.seq)"
            "  AS n FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id"
            "  WHERE d.status = 'pending' AND d.next_attempt_at <= ?) h"
            " WHERE n <= ?) o"
            " WHERE turn <= ? ORDER BY turn, next_attempt_at, seq LIMIT ?",
            (now, per_webhook, per_owner, limit),
        )
    ]


def next_due(conn: Conn) -> float | None:
    """When the earliest pending delivery falls due (``None``: none is pending)."""
    row = conn.execute(
        "SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = 'pending'"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def claim(conn: Conn, seqs: Iterable[int], node: str, now: float, lease: float) -> list[Claimed]:
    """Take the deliveries ``seqs`` that are still pending and due (another node may
    have taken some since they were read): each gets a claim token, this node's id, one
    more try counted and a lease until ``now + lease``."""
    wanted = sorted(set(seqs))
    if not wanted:
        return []
    marks = ", ".join("?" * len(wanted))
    token = new_id("clm")
    rows = list(
        conn.execute(
            "UPDATE webhook_deliveries SET claim = ?, claimed_by = ?, attempts = attempts + 1,"
            " next_attempt_at = ?, last_attempt_at = ? WHERE seq IN ("
            f"SELECT seq FROM webhook_deliveries WHERE seq IN ({marks})"
            f" AND status = 'pending' AND next_attempt_at <= ?{skip_locked(conn)})"
            " AND status = 'pending' AND next_attempt_at <= ?"
            " RETURNING seq, event_id, type, response_id, created_at, attempts, webhook_id",
            (token, node, now + lease, now, *wanted, now, now),
        )
    )
    if not rows:
        return []
    hooks = {r["webhook_id"] for r in rows}
    found = {
        h["id"]: (h["url"], h["secret"], h["client_id"])
        for h in conn.execute(
            "SELECT id, url, secret, client_id FROM webhooks"
            f" WHERE id IN ({', '.join('?' * len(hooks))})",
            tuple(hooks),
        )
    }
    return [
        Claimed(
            seq=int(r["seq"]),
            claim=token,
            event_id=r["event_id"],
            type=r["type"],
            response_id=r["response_id"],
            created_at=float(r["created_at"]),
            attempts=int(r["attempts"]),
            webhook_id=r["webhook_id"],
            owner=found[r["webhook_id"]][2],
            url=found[r["webhook_id"]][0],
            secret=found[r["webhook_id"]][1],
        )
        for r in rows
        if r["webhook_id"] in found
    ]


@dataclass(frozen=True)
class Outcome:
    """A try's result. ``next_at``: when to try again (``None`` with ``delivered``
    false: give up, the delivery failed)."""

    seq: int
    claim: str
    delivered: bool
    status_code: int | None
    error: str | None
    at: float
    next_at: float | None


def settle(conn: Conn, outcomes: list[Outcome]) -> int:
    """Record tries' outcomes, each only under the claim it was made with (a sender
    whose lease ran out and whose row another took records nothing). Returns how many
    rows changed."""
    changed = 0
    for o in outcomes:
        if o.delivered:
            status, next_at, delivered_at = "delivered", o.at, o.at
        elif o.next_at is None:
            status, next_at, delivered_at = "failed", o.at, None
        else:
            status, next_at, delivered_at = "pending", o.next_at, None
        changed += conn.execute(
            "UPDATE webhook_deliveries SET status = ?, next_attempt_at = ?, delivered_at = ?,"
            " last_status = ?, last_error = ?, last_attempt_at = ?, claim = NULL,"
            " claimed_by = NULL WHERE seq = ? AND claim = ? AND status = 'pending'",
            (status, next_at, delivered_at, o.status_code, o.error, o.at, o.seq, o.claim),
        ).rowcount
    return changed


def release(conn: Conn, node: str | None, now: float) -> int:
    """Give back the claims a node held (``None``: every claim; one SQLite node) and
    make those deliveries due now: a node starting again resends what it was sending
    when it stopped, without waiting for its old leases to end."""
    where = "claim IS NOT NULL" if node is None else "claimed_by = ?"
    args: tuple[Any, ...] = () if node is None else (node,)
    return conn.execute(
        "UPDATE webhook_deliveries SET claim = NULL, claimed_by = NULL, next_attempt_at = ?"
        f" WHERE status = 'pending' AND {where}",
        (now, *args),
    ).rowcount


def deliveries(conn: Conn, webhook_id: str, before: int | None, limit: int) -> list[Row]:
    """A webhook's deliveries, newest first, before the cursor ``before`` (a ``seq``)."""
    cursor = "" if before is None else " AND seq < ?"
    args: tuple[Any, ...] = (webhook_id,) if before is None else (webhook_id, before)
    return list(
        conn.execute(
            f"SELECT * FROM webhook_deliveries WHERE webhook_id = ?{cursor}"
            " ORDER BY seq DESC LIMIT ?",
            (*args, limit),
        )
    )


def delivery_seq(conn: Conn, webhook_id: str, event_id: str) -> int | None:
    row = conn.execute(
        "SELECT seq FROM webhook_deliveries WHERE webhook_id = ? AND event_id = ?",
        (webhook_id, event_id),
    ).fetchone()
    return None if row is None else int(row[0])


#: what a failed try shows a client that is not ``admin`` in place of its status code
#: and error: which ports of this machine answer, and how, is the operator's to know
UNDISCLOSED = "not delivered (no 2xx answer); the operator's log has the details"


def render_delivery(row: Row, *, detailed: bool = True) -> dict[str, Any]:
    """A delivery: its event, its state and its tries (``next_attempt_at`` while
    pending). ``detailed`` false (a client that is not ``admin``): a failed try's status
    code and error are not shown (:data:`UNDISCLOSED`)."""
    pending = row["status"] == "pending"
    status, error = row["last_status"], row["last_error"]
    if not detailed and error is not None:
        status, error = None, UNDISCLOSED

    def stamp(value: Any) -> float | None:
        return None if value is None else round(float(value), 3)

    return {
        "object": "webhook.delivery",
        "id": row["event_id"],
        "webhook_id": row["webhook_id"],
        "type": row["type"],
        "response_id": row["response_id"],
        "created_at": stamp(row["created_at"]),
        "status": row["status"],
        "attempts": int(row["attempts"]),
        "next_attempt_at": stamp(row["next_attempt_at"]) if pending else None,
        "last_attempt_at": stamp(row["last_attempt_at"]),
        "last_status_code": None if status is None else int(status),
        "last_error": error,
        "delivered_at": stamp(row["delivered_at"]),
    }


def delete_done_batch(conn: Conn, age: float, batch: int) -> int:
    """Retention: up to ``batch`` deliveries delivered or failed more than ``age``
    seconds ago by the database's clock (pending ones are never deleted)."""
    return conn.execute(
        "DELETE FROM webhook_deliveries WHERE seq IN (SELECT seq FROM webhook_deliveries"
        f" WHERE status != 'pending' AND last_attempt_at < {clock_sql(conn)} - ?"
        " ORDER BY last_attempt_at LIMIT ?)",
        (float(age), batch),
    ).rowcount
