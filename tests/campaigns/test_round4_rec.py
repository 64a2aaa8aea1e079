"""Round 4, issue 37: the store's typed records against rows of every shape earlier code
left in a data directory.

Random ``tasks`` and ``responses`` rows are written straight into a real SQLite file,
as the code before the records wrote them: every status and restart policy, failed
tasks with their error, snapshots in both formats (every token in the JSON, or a count
and a tail), usage with and without ``cached_tokens``, output items with non-ASCII text
and ``-Infinity`` log probabilities (``json.dumps`` writes them), flags as integers, and
requests as each earlier version stored them (tests/protocol/old_requests.json) or as
today's code stores them. Each row must read back through every reader as its typed
record, each field the column's value (JSON decoded, flags as booleans, states as
their enums), and render as a response object. Violations are counted, then reported.

``make test`` runs 60 rows; ``make torture`` (``LMSP_CAMPAIGN=long``) 2,000.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.request import dumps, from_stored
from lmsp.protocol.states import Policy, Status
from lmsp.store import clients
from lmsp.store import tasks as task_store
from lmsp.store.db import connect
from lmsp.store.migrations import migrate
from tests.campaigns.invariants import long_run, report

ROWS = 2000 if long_run() else 60
OLD = json.loads((Path(__file__).parent.parent / "protocol" / "old_requests.json").read_text())


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = connect(tmp_path / "lmsp.db")
    migrate(connection)
    yield connection
    connection.close()


def _snapshot(rng: random.Random) -> dict[str, Any] | None:
    tokens = [rng.randrange(49152) for _ in range(rng.randrange(0, 300))]
    shape = rng.choice(["none", "legacy", "chunked"])
    if shape == "none":
        return None
    small = {"seed": rng.randrange(2**31), "held": rng.choice(["", "é…", "</"])}
    if shape == "legacy":  # before the token chunks: every token in the JSON
        return {**small, "tokens": tokens, "sequence_number": rng.randrange(50)}
    return {**small, "token_count": len(tokens), "tail": tokens[-5:], "sequence_number": 3}


def _output(rng: random.Random) -> list[dict[str, Any]] | None:
    if rng.random() < 0.3:
        return None
    text = "".join(rng.choice(["a", "é", "😀", "\\", '"', "\n", "\u2028"]) for _ in range(40))
    part = {"type": "output_text", "text": text, "annotations": []}
    part["logprobs"] = [{"token": "x", "logprob": -float("inf"), "bytes": [120]}]
    return [{"type": "message", "id": f"msg_{rng.randrange(10**6)}", "status": "completed",
             "role": "assistant", "content": [part]}]  # fmt: skip


def _usage(rng: random.Random) -> dict[str, int] | None:
    if rng.random() < 0.3:
        return None
    used = {"input_tokens": rng.randrange(100), "output_tokens": rng.randrange(100)}
    used["total_tokens"] = used["input_tokens"] + used["output_tokens"]
    if rng.random() < 0.5:  # written before cached tokens were counted: no such key
        used["cached_tokens"] = rng.randrange(used["input_tokens"] + 1)
    return used


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)  # NaN/Infinity as json wrote them


def write_rows(conn: sqlite3.Connection, n: int, client_id: str, seed: int) -> list[dict[str, Any]]:
    """``n`` random task and response rows, as the code before wrote them: their
    columns' values, as each was meant."""
    rng = random.Random(seed)
    written = []
    for i in range(n):
        status = rng.choice(list(Status))
        request = rng.choice([*OLD["rows"].values(), None])
        if request is None:
            request = dumps(from_stored({"model": "m", "input": "hi", "metadata": {"i": str(i)}}))
        failed = status is Status.FAILED
        row = {
            "task_id": f"task_{i}", "response_id": f"resp_{i}", "status": status,
            "on_restart": rng.choice(list(Policy)), "attempt": rng.randrange(1, 5),
            "last": rng.randrange(-1, 100), "finished": 1700000500 if status.terminal else None,
            "error_code": "engine_error" if failed else None,
            "error_message": rng.choice(["boom", "", "é"]) if failed else None,
            "snapshot": _snapshot(rng), "node_id": rng.choice([None, "node-a"]),
            "tier": rng.randrange(3), "background": rng.random() < 0.5,
            "store": rng.random() < 0.8, "usage": _usage(rng), "output": _output(rng),
            "incomplete": rng.choice([None, "max_output_tokens"]), "request": request,
        }  # fmt: skip
        conn.execute(
            "INSERT INTO responses (id, client_id, model, model_digest, created_at, request,"
            " background, store, usage, incomplete_reason, output)"
            " VALUES (?, ?, 'm', NULL, 1700000000, ?, ?, ?, ?, ?, ?)",
            (row["response_id"], client_id, request, int(row["background"]), int(row["store"]),
             _json(row["usage"]), row["incomplete"], _json(row["output"])),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO tasks (id, response_id, client_id, status, on_restart, attempt,"
            " last_sequence_number, created_at, updated_at, finished_at, error_code,"
            " error_message, snapshot, node_id, lease_epoch, tier)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 1700000000, 1700000001, ?, ?, ?, ?, ?, 1, ?)",
            (row["task_id"], row["response_id"], client_id, status.value,
             row["on_restart"].value, row["attempt"], row["last"], row["finished"],
             row["error_code"], row["error_message"], _json(row["snapshot"]), row["node_id"],
             row["tier"]),
        )  # fmt: skip
        written.append(row)
    conn.commit()
    return written


def _task_violations(task: TaskRecord | None, row: dict[str, Any]) -> list[str]:
    if not isinstance(task, TaskRecord):
        return [f"{row['task_id']}: not a TaskRecord: {task!r}"]
    got = (task.status, task.on_restart, task.attempt, task.last_sequence_number,
           task.finished_at, task.error_code, task.error_message, task.snapshot,
           task.node_id, task.tier)  # fmt: skip
    meant = (row["status"], row["on_restart"], row["attempt"], row["last"], row["finished"],
             row["error_code"], row["error_message"], row["snapshot"], row["node_id"],
             row["tier"])  # fmt: skip
    if got != meant or type(task.status) is not Status or type(task.on_restart) is not Policy:
        return [f"{row['task_id']}: read as {got}, stored {meant}"]
    return []


def _response_violations(response: ResponseRecord | None, row: dict[str, Any]) -> list[str]:
    if not isinstance(response, ResponseRecord):
        return [f"{row['response_id']}: not a ResponseRecord: {response!r}"]
    got = (response.background, response.store, response.usage, response.output,
           response.incomplete_reason)  # fmt: skip
    meant = (row["background"], row["store"], row["usage"], row["output"], row["incomplete"])
    if got != meant or type(response.background) is not bool:
        return [f"{row['response_id']}: read as {got!r}, stored {meant!r}"]
    return []


def check_rows(conn: sqlite3.Connection, written: list[dict[str, Any]]) -> list[str]:
    violations: list[str] = []
    listed = {task.id: task for task in task_store.page(conn, None, None, None, len(written))}
    unfinished = {task.id for task in task_store.unfinished(conn)}
    for row in written:
        task = task_store.get(conn, row["task_id"])
        violations += _task_violations(task, row)
        violations += _task_violations(task_store.of_response(conn, row["response_id"]), row)
        violations += _task_violations(listed.get(row["task_id"]), row)
        if (row["task_id"] in unfinished) == row["status"].terminal:
            violations.append(f"{row['task_id']}: unfinished() disagrees with its status")
        violations += _response_violations(task_store.get_response(conn, row["response_id"]), row)
        if task is None:
            continue
        try:
            shown = task_store.render_response(conn, task)
        except Exception as exc:  # counted, reported at the end
            violations.append(f"{row['task_id']}: rendering failed: {exc!r}")
            continue
        if shown["task"]["status"] != row["status"].value or shown["store"] != row["store"]:
            violations.append(f"{row['task_id']}: rendered as {shown['task']}")
    return violations


def test_rows_of_every_earlier_shape_read_as_typed_records(conn: sqlite3.Connection) -> None:
    client, _ = clients.add(conn, "campaign", ["responses:read"])
    conn.commit()
    written = write_rows(conn, ROWS, client.id, seed=37)
    violations = check_rows(conn, written)
    shapes = sum(1 for row in written if row["snapshot"] and "tokens" in row["snapshot"])
    report(
        f"round4 rec: {len(written)} old-shape task/response rows read through 5 readers and"
        f" rendered ({shapes} legacy snapshots), {len(violations)} violations"
    )
    assert not violations, "\n".join(violations[:20])
