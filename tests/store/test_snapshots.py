"""Snapshots on real SQLite files: the token ids are appended in chunks, so a flush
writes only its new tokens, the snapshot reads back exactly, and every path that
discards a snapshot (a fresh start, a requeue with reset, a terminal state, deleting
the task) takes its chunks with it."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lmsp.protocol.assembler import OutputAssembler
from lmsp.protocol.request import from_stored
from lmsp.protocol.states import Status
from lmsp.runner.retention import delete_finished_batch
from lmsp.store import clients, snapshots
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.db import connect
from lmsp.store.migrations import migrate
from tests.helpers import check_log_invariants, text_events

T = TypeVar("T")
#: more tokens than the JSON's tail holds: a flush of these writes a chunk
LONG = list(range(1000, 1300))


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = connect(tmp_path / "lmsp.db")
    migrate(connection)
    yield connection
    connection.close()


def tx(conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], T]) -> T:
    """One write transaction, as the store's writer runs each job."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = job(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def running_task(conn: sqlite3.Connection, on_restart: str = "resume") -> str:
    def job(c: sqlite3.Connection) -> str:
        client, _ = clients.add(c, "snapshots", ["responses"])
        created = response_store.create(
            c,
            client_id=client.id,
            request=from_stored({"model": "m", "input": "hi", "background": True}),
            on_restart=on_restart,
            max_queue=100,
            key=None,
        )
        assert task_store.claim_next(c) is not None
        assert task_store.start(c, created.task_id, None) is not None
        return created.task_id

    return tx(conn, job)


def flush(conn: sqlite3.Connection, task_id: str, tokens: list[int], held: str = "") -> bool:
    """One runner flush: an event per new token and the snapshot of all tokens so far."""
    snap: dict[str, Any] = {"tokens": list(tokens), "seed": 7, "held": held}
    batch = text_events(OutputAssembler(), ["x"]) if tokens else []
    return tx(conn, lambda c: task_store.append_output(c, task_id, batch, snap))


def chunk_rows(conn: sqlite3.Connection, task_id: str | None = None) -> int:
    if task_id is None:
        return int(conn.execute("SELECT count(*) FROM task_tokens").fetchone()[0])
    return int(
        conn.execute("SELECT count(*) FROM task_tokens WHERE task_id = ?", (task_id,)).fetchone()[0]
    )


def chunk_starts(conn: sqlite3.Connection, task_id: str) -> list[int]:
    rows = conn.execute(
        "SELECT start FROM task_tokens WHERE task_id = ? ORDER BY start", (task_id,)
    )
    return [int(r[0]) for r in rows]


def snapshot_json(conn: sqlite3.Connection, task_id: str) -> str | None:
    row = conn.execute("SELECT snapshot FROM tasks WHERE id = ?", (task_id,)).fetchone()
    assert row is not None
    value: str | None = row[0]
    return value


def test_a_held_lone_surrogate_is_kept_across_flushes(conn: sqlite3.Connection) -> None:
    """Held text the UTF-8 of msgspec's encoder cannot hold (a lone surrogate) is
    written escaped, and the next flush, which reads the stored snapshot back, reads it
    too."""
    task_id = running_task(conn)
    for hi in (2, 5, 9):
        assert flush(conn, task_id, LONG[:hi], held="a\ud800b")
        loaded = task_store.snapshot(conn, task_id)
        assert loaded is not None
        assert loaded["tokens"] == LONG[:hi] and loaded["held"] == "a\ud800b"


def test_the_chunks_round_trip_exactly(conn: sqlite3.Connection) -> None:
    task_id = running_task(conn)
    assert task_store.snapshot(conn, task_id) is None  # nothing flushed yet
    # ids across the int32 range; flushes of uneven sizes, one with nothing new, one
    # larger than a chunk, so the tokens end up in chunks and in the tail
    rng = random.Random(1)
    tokens = [0, 1, 2**31 - 1, 49151] + [rng.randrange(49152) for _ in range(546)]
    for hi in (1, 4, 4, 9, 100, 300, 301, 450, 550):
        assert flush(conn, task_id, tokens[:hi], held=f"h{hi}")
        loaded = task_store.snapshot(conn, task_id)
        assert loaded is not None and loaded["tokens"] == tokens[:hi]
    task = task_store.get(conn, task_id)
    assert task is not None
    assert task_store.snapshot(conn, task_id) == {
        "tokens": tokens,
        "seed": 7,
        "held": "h550",
        "sequence_number": task.last_sequence_number,
    }
    # sealed at 300 (all 300 so far) and 450 (150 more); 100 wait in the tail
    assert chunk_starts(conn, task_id) == [0, 300]
    assert len(json.loads(snapshot_json(conn, task_id) or "{}")["tail"]) == 100
    assert snapshots.unpack(snapshots.pack(tokens)) == tokens


def test_each_token_is_written_to_a_chunk_once(conn: sqlite3.Connection) -> None:
    """N flushes of k tokens: the chunks (append-only, never rewritten) hold exactly the
    sealed tokens, 4 bytes each, and the JSON rewritten by every flush stays bounded
    however long the output grows: the bytes written grow linearly, not squared."""
    task_id = running_task(conn)
    k, seal = 8, snapshots.SEAL
    sizes: list[int] = []
    tokens: list[int] = []
    for n in range(1, 501):  # 4,000 tokens
        tokens.extend(range(40000 + len(tokens), 40000 + len(tokens) + k))  # five digits
        assert flush(conn, task_id, tokens)
        sealed = n * k // seal * seal
        assert snapshots.stored_bytes(conn, task_id) == snapshots.TOKEN_BYTES * sealed
        assert chunk_starts(conn, task_id) == list(range(0, sealed, seal))
        sizes.append(len(snapshot_json(conn, task_id) or ""))
    # the JSON's largest size is reached within the first chunk's worth of flushes and
    # never exceeded after (only the count and sequence number gain a digit or two)
    first = max(sizes[: seal // k])
    assert max(sizes) <= first + 4
    assert max(sizes) < 6 * seal + 120  # five digits and a comma per tail token
    loaded = task_store.snapshot(conn, task_id)
    assert loaded is not None and loaded["tokens"] == tokens


def test_tokens_only_grow_while_running(conn: sqlite3.Connection) -> None:
    task_id = running_task(conn)
    assert flush(conn, task_id, LONG)
    with pytest.raises(ValueError):
        flush(conn, task_id, LONG[:-1])
    loaded = task_store.snapshot(conn, task_id)  # the failed flush rolled back whole
    assert loaded is not None and loaded["tokens"] == LONG


def test_a_retried_task_starts_with_no_tokens(conn: sqlite3.Connection) -> None:
    task_id = running_task(conn, on_restart="retry")
    assert flush(conn, task_id, LONG)
    assert chunk_rows(conn, task_id) == 1
    moved = tx(conn, lambda c: task_store.requeue(c, task_id, reset=True))
    assert moved is not None and moved.snapshot is None
    assert chunk_rows(conn, task_id) == 0
    assert task_store.snapshot(conn, task_id) is None
    # the next attempt writes its own tokens from the first
    assert tx(conn, lambda c: task_store.claim_next(c)) is not None
    assert tx(conn, lambda c: task_store.start(c, task_id, None)) is not None
    assert flush(conn, task_id, [9])
    loaded = task_store.snapshot(conn, task_id)
    assert loaded is not None and loaded["tokens"] == [9]


def test_a_fresh_start_drops_a_snapshot_kept_by_a_requeue(conn: sqlite3.Connection) -> None:
    """A requeue without reset keeps the snapshot, but the run that follows starts from
    the first token: ``start`` clears it, so its first flush is not refused."""
    task_id = running_task(conn)
    assert flush(conn, task_id, LONG)
    assert tx(conn, lambda c: task_store.requeue(c, task_id, reset=False)) is not None
    assert tx(conn, lambda c: task_store.claim_next(c)) is not None
    started = tx(conn, lambda c: task_store.start(c, task_id, None))
    assert started is not None and started.snapshot is None
    assert chunk_rows(conn, task_id) == 0
    assert flush(conn, task_id, [1])


def test_a_finished_task_keeps_no_snapshot(conn: sqlite3.Connection) -> None:
    done = running_task(conn)
    assert flush(conn, done, LONG)

    def finish(c: sqlite3.Connection) -> Any:
        # the runner's last word: its final batch and snapshot, then the completion
        task_store.append_output(c, done, [], {"tokens": [*LONG, 1], "seed": 7})
        usage = {"input_tokens": 1, "output_tokens": 301, "total_tokens": 302}
        return task_store.settle(c, done, task_store.Completion([], [], usage))

    assert tx(conn, finish) == Status.COMPLETED
    failed = running_task(conn)
    assert flush(conn, failed, LONG)
    assert tx(conn, lambda c: task_store.fail(c, failed, "engine_error", "boom")) is not None
    for task_id in (done, failed):
        assert snapshot_json(conn, task_id) is None
        assert chunk_rows(conn, task_id) == 0
    check_log_invariants(conn)


def test_deleting_a_task_deletes_its_chunks(conn: sqlite3.Connection) -> None:
    kept = running_task(conn)
    assert flush(conn, kept, LONG)
    gone = running_task(conn)
    assert flush(conn, gone, LONG)
    assert chunk_rows(conn) == 2
    # a finished task has no chunks left already; a task deleted with its response
    # (what retention and DELETE do) takes any it has by the cascade
    tx(
        conn,
        lambda c: c.execute(
            "DELETE FROM responses WHERE id = (SELECT response_id FROM tasks WHERE id = ?)", (gone,)
        ),
    )
    assert chunk_rows(conn, gone) == 0
    assert chunk_rows(conn) == 1
    assert tx(conn, lambda c: task_store.fail(c, kept, "engine_error", "boom")) is not None
    assert tx(conn, lambda c: delete_finished_batch(c, age=-(2**40))) == 1
    assert chunk_rows(conn) == 0
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0


def test_a_snapshot_from_before_the_chunks_reads_and_carries_over(
    conn: sqlite3.Connection,
) -> None:
    """A task running when the service was upgraded has its tokens in the JSON: it
    resumes from them, and its next flush moves them into a chunk."""
    task_id = running_task(conn)
    legacy = {"tokens": LONG[:200], "seed": 3, "held": "", "sequence_number": 2}
    tx(
        conn,
        lambda c: c.execute(
            "UPDATE tasks SET snapshot = ? WHERE id = ?", (json.dumps(legacy), task_id)
        ),
    )
    assert task_store.snapshot(conn, task_id) == legacy
    assert flush(conn, task_id, LONG[:201])
    loaded = task_store.snapshot(conn, task_id)
    assert loaded is not None and loaded["tokens"] == LONG[:201]
    assert "tokens" not in json.loads(snapshot_json(conn, task_id) or "{}")
    assert snapshots.stored_bytes(conn, task_id) == 201 * snapshots.TOKEN_BYTES


def test_chunks_that_disagree_with_the_count_are_refused(conn: sqlite3.Connection) -> None:
    task_id = running_task(conn)
    assert flush(conn, task_id, LONG)
    tx(conn, lambda c: c.execute("DELETE FROM task_tokens WHERE task_id = ?", (task_id,)))
    with pytest.raises(snapshots.SnapshotError):
        task_store.snapshot(conn, task_id)
