"""The usage ledger (PROTOCOL.md 13): requests, input, cached and output tokens per
client, per model, per UTC day, and tokens per client per minute (what
``tokens_per_minute`` counts).

:func:`record_finished` is called by :func:`lmsp.store.tasks.move` when a task reaches a
terminal state, in the transaction that finishes it: a request is counted exactly once,
with the usage its response carries. A failed or cancelled one (a client that left, a
cancel, a revoke, an engine error, a restart) carries what it consumed before it
stopped: the prompt tokens given to the engine and the tokens generated. An embeddings
request is no task: :func:`record` counts it once its engine was given the inputs
(:mod:`lmsp.app.embeddings`). The ledger is kept apart from responses: deleting a
response, or retention sweeping it, leaves its usage counted.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lmsp.protocol.records import TaskRecord
from lmsp.store.sql import Conn, Row, where

GROUPS = ("day", "model")
COLUMNS = ("requests", "input_tokens", "cached_tokens", "output_tokens")


def day_of(stamp: int) -> str:
    """The UTC day of a Unix time, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(stamp))


def record_finished(conn: Conn, task: TaskRecord) -> None:
    """Add a finished task's request and tokens to its client's ledger."""
    response = conn.execute(
        "SELECT model, usage FROM responses WHERE id = ?", (task.response_id,)
    ).fetchone()
    if response is None:
        return
    reported: dict[str, Any] = json.loads(response["usage"]) if response["usage"] else {}
    record(
        conn,
        task.client_id,
        response["model"],
        task.finished_at or task.updated_at,
        prompt=int(reported.get("input_tokens") or 0),
        cached=int(reported.get("cached_tokens") or 0),
        generated=int(reported.get("output_tokens") or 0),
    )


def record(
    conn: Conn,
    client_id: str,
    model: str,
    stamp: int,
    *,
    prompt: int,
    cached: int = 0,
    generated: int = 0,
) -> None:
    """Count one request of ``client_id`` on ``model`` at ``stamp`` (a Unix time): its
    prompt tokens (``cached`` of them from a cached prefix) and generated tokens."""
    conn.execute(
        "INSERT INTO usage_daily (client_id, model, day, requests, input_tokens, cached_tokens,"
        " output_tokens) VALUES (?, ?, ?, 1, ?, ?, ?) ON CONFLICT (client_id, model, day)"
        " DO UPDATE SET requests = usage_daily.requests + 1,"
        " input_tokens = usage_daily.input_tokens + excluded.input_tokens,"
        " cached_tokens = usage_daily.cached_tokens + excluded.cached_tokens,"
        " output_tokens = usage_daily.output_tokens + excluded.output_tokens",
        (client_id, model, day_of(stamp), prompt, cached, generated),
    )
    if prompt + generated:
        minute = stamp // 60
        conn.execute(
            "INSERT INTO usage_minutes (client_id, minute, tokens) VALUES (?, ?, ?)"
            " ON CONFLICT (client_id, minute)"
            " DO UPDATE SET tokens = usage_minutes.tokens + excluded.tokens",
            (client_id, minute, prompt + generated),
        )
        # only the current minute is ever read: older ones go
        conn.execute(
            "DELETE FROM usage_minutes WHERE client_id = ? AND minute < ?",
            (client_id, minute - 1),
        )


def tokens_in_minute(conn: Conn, client_id: str, stamp: int) -> int:
    """Tokens (prompted and generated) of the client's requests finished this UTC minute."""
    row = conn.execute(
        "SELECT tokens FROM usage_minutes WHERE client_id = ? AND minute = ?",
        (client_id, stamp // 60),
    ).fetchone()
    return 0 if row is None else int(row[0])


def tokens_on_day(conn: Conn, client_id: str, stamp: int) -> int:
    """Tokens (prompted and generated) of the client's requests finished this UTC day."""
    row = conn.execute(
        "SELECT coalesce(sum(input_tokens + output_tokens), 0) FROM usage_daily"
        " WHERE client_id = ? AND day = ?",
        (client_id, day_of(stamp)),
    ).fetchone()
    return int(row[0])


def summary(
    conn: Conn,
    client_id: str | None,
    since: int | None,
    until: int | None,
    group_by: tuple[str, ...],
) -> list[dict[str, Any]]:
    """The ledger summed per client and per ``group_by`` (``day``, ``model``), over the
    days from ``since``'s to ``until``'s (Unix times; UTC days, both included)."""
    clause, args = where(
        ("u.client_id = ?", client_id),
        ("u.day >= ?", None if since is None else day_of(since)),
        ("u.day <= ?", None if until is None else day_of(until)),
    )
    keys = ["u.client_id", *(f"u.{name}" for name in GROUPS if name in group_by)]
    sums = ", ".join(f"sum(u.{name}) AS {name}" for name in COLUMNS)
    rows = conn.execute(
        f"SELECT {', '.join(keys)}, c.name AS client_name, {sums} FROM usage_daily u"
        f" LEFT JOIN clients c ON c.id = u.client_id{clause}"
        f" GROUP BY {', '.join(keys)}, c.name ORDER BY {', '.join(keys)}",
        args,
    )
    out = []
    for row in rows:
        item: dict[str, Any] = {"object": "usage", "client_id": row["client_id"]}
        item["client_name"] = row["client_name"]
        for name in GROUPS:
            if name in group_by:
                item[name] = row[name]
        for name in COLUMNS:
            item[name] = int(row[name] or 0)
        item["total_tokens"] = item["input_tokens"] + item["output_tokens"]
        out.append(item)
    return out


def totals_by_client(conn: Conn) -> list[Row]:
    """Every client's totals since it started (the Prometheus counters)."""
    return list(
        conn.execute(
            "SELECT u.client_id, c.name, sum(u.requests) AS requests,"
            " sum(u.input_tokens) AS input_tokens, sum(u.cached_tokens) AS cached_tokens,"
            " sum(u.output_tokens) AS output_tokens FROM usage_daily u"
            " LEFT JOIN clients c ON c.id = u.client_id GROUP BY u.client_id, c.name"
            " ORDER BY u.client_id"
        )
    )
