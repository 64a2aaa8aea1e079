"""The per-task event log: append with gap-free sequence numbers, read after a number."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from lmsp.ids import now as _now
from lmsp.protocol import events as ev
from lmsp.store.sql import Conn

_OUTPUT_TYPES = ",".join(f"'{kind}'" for kind in sorted(ev.OUTPUT))
_ENCODER = msgspec.json.Encoder()


def encode(body: dict[str, Any]) -> str:
    """An event as the compact JSON it is stored (and streamed) as: msgspec's encoder,
    a twentieth of ``json.dumps``'s time; what it cannot write (a lone surrogate, which
    UTF-8 cannot hold) goes through ``json.dumps``, which escapes it."""
    try:
        return _ENCODER.encode(body).decode()
    except (TypeError, ValueError, UnicodeError, msgspec.EncodeError):
        return json.dumps(body, separators=(",", ":"))


def append(conn: Conn, task_id: str, events: list[dict[str, Any]]) -> int:
    """Append ``events`` to the task's log inside the caller's transaction.

    Numbers them from the task's ``last_sequence_number`` + 1 and moves that counter in
    the same transaction (11.2). Returns the last number written.
    """
    # the counter moves first, in one statement: it locks the task's row, so two
    # transactions (two nodes) can never number events alike
    row = conn.execute(
        "UPDATE tasks SET last_sequence_number = last_sequence_number + ? WHERE id = ?"
        " RETURNING last_sequence_number",
        (len(events), task_id),
    ).fetchone()
    if row is None:
        raise LookupError(task_id)
    seq = int(row[0]) - len(events)
    stamp = _now()
    rows = []
    for event in events:
        seq += 1
        kind = event["type"]
        body = {"type": kind, "sequence_number": seq, **event}
        body["type"], body["sequence_number"] = kind, seq  # first, whatever the event held
        rows.append((task_id, seq, kind, encode(body), stamp))
    conn.executemany(
        "INSERT INTO task_events (task_id, sequence_number, type, data, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        rows,
    )
    appended = getattr(conn, "appended", None)
    if appended is not None:  # the writer's: published once committed (store/tail.py)
        appended.extend(row[:4] for row in rows)
    return seq


def after(
    conn: Conn, task_id: str, after_seq: int, limit: int = 1000
) -> list[tuple[int, str, str]]:
    """Events with ``sequence_number > after_seq``: ``(seq, type, json)`` in order."""
    return [
        (int(r[0]), str(r[1]), str(r[2]))
        for r in conn.execute(
            "SELECT sequence_number, type, data FROM task_events"
            " WHERE task_id = ? AND sequence_number > ? ORDER BY sequence_number LIMIT ?",
            (task_id, after_seq, limit),
        )
    ]


def output_events(conn: Conn, task_id: str) -> list[dict[str, Any]]:
    """The output events of the task's current attempt (a retry's ``reset`` discards the
    output logged before it), parsed, in order."""
    start = -1
    for seq, data in conn.execute(
        "SELECT sequence_number, data FROM task_events WHERE task_id = ? AND type = ?"
        " ORDER BY sequence_number",
        (task_id, ev.QUEUED),
    ):
        if json.loads(data).get("reset"):
            start = int(seq)
    return [
        json.loads(r[0])
        for r in conn.execute(
            "SELECT data FROM task_events WHERE task_id = ? AND sequence_number > ?"
            f" AND type IN ({_OUTPUT_TYPES}) ORDER BY sequence_number",
            (task_id, start),
        )
    ]
