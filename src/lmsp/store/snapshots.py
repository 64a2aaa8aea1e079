"""A running task's snapshot: what a resume needs to continue exactly where the log ends.

The runner flushes every few tens of milliseconds, each time with the whole token list
so far. Rewriting that list on every flush made the bytes written grow with the square
of the output's length. Now the JSON in ``tasks.snapshot`` holds the small fields
(``seed``, ``held``, ``sequence_number``), ``token_count`` and only the ``tail``: the
last tokens, fewer than :data:`SEAL`. Once the tail reaches ``SEAL`` tokens it moves,
once, into an append-only chunk of ``task_tokens`` (int32 little-endian; ``start`` is
the index of its first token). So a flush rewrites at most a bounded JSON, inside the
``tasks`` row page that logging its events writes anyway, and every token id is written
to a chunk exactly once: a task's snapshot bytes grow linearly with its output. (A chunk
per flush would cost a page of its own per commit, more than the old scheme for short
outputs; the tail keeps short outputs to the one page.) The JSON and the chunks are
written in the caller's transaction, the one that logs the events they cover, so they
always agree.

Tokens only grow while a task runs; a fresh start, a requeue that discards the output
and a terminal state clear the snapshot and its chunks together (deleting a task
deletes its chunks by ``ON DELETE CASCADE``).

A snapshot written before the chunks existed holds all its tokens in the JSON (no
``token_count``): it reads as such, and its next write carries them over.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import msgspec

from lmsp.protocol.objects import usage_counts
from lmsp.store import events
from lmsp.store.sql import Conn

#: how many bytes one token id takes in a chunk
TOKEN_BYTES = 4
#: tokens the JSON holds before they move into a chunk (a JSON of at most ~1 KB)
SEAL = 128


class SnapshotError(RuntimeError):
    """The chunks do not add up to the count the snapshot records (a damaged store)."""


def pack(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def unpack(blob: bytes) -> list[int]:
    if len(blob) % TOKEN_BYTES:
        raise SnapshotError(f"a token chunk of {len(blob)} bytes")
    return list(struct.unpack(f"<{len(blob) // TOKEN_BYTES}i", blob))


def decode(text: str) -> dict[str, Any]:
    """A stored snapshot's JSON, read (msgspec's decoder; ``json.loads`` for what it
    refuses: an escaped lone surrogate, which :func:`lmsp.store.events.encode` writes)."""
    try:
        snap: dict[str, Any] = msgspec.json.decode(text)
    except msgspec.DecodeError:
        snap = json.loads(text)
    return snap


def _counts(snap: dict[str, Any] | None) -> tuple[int, int]:
    """(tokens the snapshot covers, tokens of them in chunks)."""
    if not snap:
        return 0, 0
    if "token_count" not in snap:  # legacy: every token in the JSON, none in chunks
        return len(snap.get("tokens", [])), 0
    total = int(snap["token_count"])
    return total, total - len(snap.get("tail", []))


def write(
    conn: Conn,
    task_id: str,
    previous: dict[str, Any] | None,
    snapshot: dict[str, Any],
    sequence_number: int,
    stamp: int,
) -> bool:
    """Record ``snapshot`` (its ``tokens`` the whole list so far) for a ``running`` task
    whose stored snapshot was ``previous`` (its JSON, read): rewrite the small JSON
    with the tail, and seal the tail into a chunk once it is ``SEAL`` long. Returns
    ``False``, writing nothing, if the task is not running."""
    tokens: list[int] = list(snapshot.get("tokens", []))
    covered, chunked = _counts(previous)
    if len(tokens) < covered:
        raise ValueError(f"a snapshot of {len(tokens)} tokens after one of {covered}")
    tail = tokens[chunked:]
    seal = len(tail) >= SEAL
    small = {k: v for k, v in snapshot.items() if k != "tokens"}
    small.update(
        token_count=len(tokens), tail=[] if seal else tail, sequence_number=sequence_number
    )
    cur = conn.execute(
        "UPDATE tasks SET snapshot = ?, updated_at = ? WHERE id = ? AND status = 'running'",
        (events.encode(small), stamp, task_id),
    )
    if cur.rowcount != 1:
        return False
    if seal:
        conn.execute(
            "INSERT INTO task_tokens (task_id, start, tokens) VALUES (?, ?, ?)",
            (task_id, chunked, pack(tail)),
        )
    return True


def read(conn: Conn, task_id: str) -> dict[str, Any] | None:
    """The task's snapshot as the runner wrote it, ``tokens`` reassembled from the
    chunks (one statement, so the JSON and the chunks come from the same commit)."""
    rows = conn.execute(
        "SELECT t.snapshot, c.start, c.tokens FROM tasks t"
        " LEFT JOIN task_tokens c ON c.task_id = t.id WHERE t.id = ? ORDER BY c.start",
        (task_id,),
    ).fetchall()
    if not rows or not rows[0][0]:
        return None
    snap: dict[str, Any] = json.loads(rows[0][0])
    if "token_count" not in snap:
        return snap  # legacy: the tokens are in the JSON
    count = int(snap.pop("token_count"))
    tail: list[int] = snap.pop("tail", [])
    tokens: list[int] = []
    for _, start, blob in rows:
        if blob is None:
            continue  # no chunk at all (the LEFT JOIN's one empty row)
        if start != len(tokens):
            raise SnapshotError(f"task {task_id}: a chunk at {start} after {len(tokens)} tokens")
        tokens.extend(unpack(blob))
    tokens.extend(tail)
    if len(tokens) != count:
        raise SnapshotError(f"task {task_id}: {len(tokens)} tokens stored, {count} recorded")
    snap["tokens"] = tokens
    return snap


def spent(conn: Conn, task_id: str) -> dict[str, int] | None:
    """The usage a task's snapshot records: the tokens generated so far and the prompt
    tokens given to the engine (``input_tokens``, when the runner noted them); ``None``
    without a snapshot. What a task stopped by a restart is charged (its runner could
    not say)."""
    row = conn.execute("SELECT snapshot FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None or not row[0]:
        return None
    snap = json.loads(row[0])
    generated = snap["token_count"] if "token_count" in snap else len(snap.get("tokens", []))
    return usage_counts(int(snap.get("input_tokens", 0)), int(generated))


def clear(conn: Conn, task_id: str) -> None:
    """Drop a task's token chunks (the caller clears its snapshot JSON with them)."""
    conn.execute("DELETE FROM task_tokens WHERE task_id = ?", (task_id,))


def stored_bytes(conn: Conn, task_id: str) -> int:
    """The bytes of token ids stored for a task (what the chunks cost, for tests and
    the benchmark)."""
    row = conn.execute(
        "SELECT coalesce(sum(length(tokens)), 0) FROM task_tokens WHERE task_id = ?", (task_id,)
    ).fetchone()
    return int(row[0])
