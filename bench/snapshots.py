"""What a task's snapshots cost to write: the old scheme against the chunks.

    .venv/bin/python bench/snapshots.py [--tokens 2000] [--every 8]

(e) one task of ``--tokens`` output tokens flushed every ``--every`` tokens, each flush
    one transaction holding its delta events and the snapshot covering them, on a real
    SQLite file (WAL, synchronous=FULL, no checkpoint while it runs, so the WAL holds
    every page written). The old scheme rewrote the JSON of all the token ids on every
    flush; the new one appends the new ids as a chunk and rewrites a small JSON. Shown:
    the snapshot bytes handed to SQLite, and the WAL bytes of the whole run (events
    included), for each.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lmsp.protocol.assembler import OutputAssembler, TextDelta  # noqa: E402
from lmsp.protocol.request import from_stored  # noqa: E402
from lmsp.store import clients, events  # noqa: E402
from lmsp.store import responses as response_store  # noqa: E402
from lmsp.store import tasks as task_store  # noqa: E402
from lmsp.store.db import connect  # noqa: E402
from lmsp.store.migrations import migrate  # noqa: E402

VOCAB = 49152  # the bundled model's vocabulary: token ids of up to five digits

Writer = Callable[[sqlite3.Connection, str, list[dict[str, Any]], dict[str, Any]], int]


def old_append(
    conn: sqlite3.Connection, task_id: str, batch: list[dict[str, Any]], snap: dict[str, Any]
) -> int:
    """The scheme before m007: the whole snapshot, every token id, as JSON each flush."""
    task = task_store.get(conn, task_id)
    assert task is not None
    seq = events.append(conn, task_id, batch) if batch else task.last_sequence_number
    text = json.dumps(dict(snap, sequence_number=seq), separators=(",", ":"))
    conn.execute("UPDATE tasks SET snapshot = ? WHERE id = ?", (text, task_id))
    return len(text)


def new_append(
    conn: sqlite3.Connection, task_id: str, batch: list[dict[str, Any]], snap: dict[str, Any]
) -> int:
    """Today's: the new token ids as a chunk, the small fields as JSON."""
    before = _chunk_bytes(conn, task_id)
    assert task_store.append_output(conn, task_id, batch, snap)
    text = conn.execute("SELECT snapshot FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
    return len(text) + _chunk_bytes(conn, task_id) - before


def no_snapshot(
    conn: sqlite3.Connection, task_id: str, batch: list[dict[str, Any]], snap: dict[str, Any]
) -> int:
    """The baseline: the delta events alone, no snapshot at all."""
    events.append(conn, task_id, batch)
    return 0


def _chunk_bytes(conn: sqlite3.Connection, task_id: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(length(tokens)), 0) FROM task_tokens WHERE task_id = ?", (task_id,)
    ).fetchone()
    return int(row[0])


def run(path: Path, writer: Writer, total: int, every: int) -> tuple[int, int]:
    """One task's flushes through ``writer``: (snapshot bytes written, WAL bytes)."""
    conn = connect(path)
    migrate(conn)
    conn.execute("PRAGMA wal_autocheckpoint=0")  # keep every written page in the WAL

    def create(c: sqlite3.Connection) -> str:
        client, _ = clients.add(c, "bench", ["responses"])
        created = response_store.create(
            c,
            client_id=client.id,
            request=from_stored({"model": "m", "input": "a story", "background": True}),
            on_restart="resume",
            max_queue=10,
            key=None,
        )
        task_store.claim_next(c)
        task_store.start(c, created.task_id, None)
        return created.task_id

    task_id = _tx(conn, create)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count only the flushes' writes
    rng = random.Random(0)
    assembler = OutputAssembler()
    tokens: list[int] = []
    written = 0
    while len(tokens) < total:
        new = [rng.randrange(VOCAB) for _ in range(min(every, total - len(tokens)))]
        tokens.extend(new)
        batch = [e for _ in new for e in assembler.feed(TextDelta(" word"))]
        snap: dict[str, Any] = {"tokens": list(tokens), "seed": 1, "held": ""}

        def flush(c: sqlite3.Connection, b: list[dict[str, Any]] = batch, s: Any = snap) -> int:
            return writer(c, task_id, b, s)

        written += _tx(conn, flush)
    wal = Path(f"{path}-wal").stat().st_size
    conn.close()
    return written, wal


def _tx(conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], Any]) -> Any:
    conn.execute("BEGIN IMMEDIATE")
    result = job(conn)
    conn.execute("COMMIT")
    return result


def bench_snapshots(total: int = 2000, every: int = 8) -> None:
    with tempfile.TemporaryDirectory(prefix="lmsp-snap-") as tmp:
        _, base_wal = run(Path(tmp) / "none.db", no_snapshot, total, every)
        old, old_wal = run(Path(tmp) / "old.db", old_append, total, every)
        new, new_wal = run(Path(tmp) / "new.db", new_append, total, every)
    flushes = -(-total // every)
    mb = 1e6
    print(
        f"\n(e) snapshots, one {total:,}-token task flushed every {every} tokens"
        f" ({flushes} commits): snapshot bytes old {old / mb:.2f} MB, new {new / mb:.3f} MB"
        f" ({old / new:.0f}x less); WAL bytes the snapshots add to the delta events'"
        f" {base_wal / mb:.2f} MB: old {(old_wal - base_wal) / mb:.2f} MB,"
        f" new {(new_wal - base_wal) / mb:.2f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000, help="output tokens of the task")
    parser.add_argument("--every", type=int, default=8, help="tokens per flush")
    args = parser.parse_args()
    bench_snapshots(args.tokens, args.every)


if __name__ == "__main__":
    main()
