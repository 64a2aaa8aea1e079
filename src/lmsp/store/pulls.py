"""Model pulls (PROTOCOL.md section 12): the rows of the tasks that download a model.

A pull is a task like any other (its row, its response row, its event log, its
``on_restart``), plus one ``model_pulls`` row: the reference it came from, the files it
fetches (pinned to one commit of the hub, each with the hub's SHA-256 and size), the node
whose data directory they go into, and how far it got. Every write here is conditional on
the task still being ``running`` (a committed cancel wins), in the caller's transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lmsp.ids import now as _now
from lmsp.protocol.records import TaskRecord, typed
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.states import UNFINISHED_SQL, Status
from lmsp.store import events, idempotency, models
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.nodes import Node
from lmsp.store.sql import Conn, Row, skip_locked

PROGRESS = "model.pull.progress"


@dataclass(frozen=True)
class HubFile:
    """One file of a pull: its path in the repo, size and the hub's SHA-256 (LFS oid)."""

    path: str
    size: int
    sha256: str

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}"


@dataclass(frozen=True)
class Pull:
    task_id: str
    ref: str
    model_id: str
    node: str
    repo: str
    revision: str
    quant: str
    files: tuple[HubFile, ...]
    total_bytes: int
    part: int
    part_bytes: int
    bytes_done: int
    client_id: str = ""


def _pull(row: Row) -> Pull:
    return typed(Pull, row, "files")


def get(conn: Conn, task_id: str) -> Pull | None:
    row = conn.execute("SELECT * FROM model_pulls WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else _pull(row)


def is_pull(conn: Conn, task_id: str) -> bool:
    found = conn.execute("SELECT 1 FROM model_pulls WHERE task_id = ?", (task_id,)).fetchone()
    return found is not None


def unfinished(conn: Conn, ref: str, model_id: str, node: str) -> TaskRecord | None:
    """The unfinished pull of ``ref`` into ``model_id`` on ``node``, if any (pulling the
    same reference again joins it: idempotent by reference)."""
    row = conn.execute(
        "SELECT t.* FROM tasks t JOIN model_pulls p ON p.task_id = t.id"
        f" WHERE p.ref = ? AND p.model_id = ? AND p.node = ? AND t.status IN ({UNFINISHED_SQL})"
        " ORDER BY t.seq LIMIT 1",
        (ref, model_id, node),
    ).fetchone()
    return None if row is None else TaskRecord.of(row)


def any_unfinished_into(conn: Conn, model_id: str, node: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM tasks t JOIN model_pulls p ON p.task_id = t.id"
        f" WHERE p.model_id = ? AND p.node = ? AND t.status IN ({UNFINISHED_SQL})",
        (model_id, node),
    ).fetchone()
    return row is not None


def create(
    conn: Conn,
    *,
    client_id: str,
    ref: str,
    model_id: str,
    node: str,
    repo: str,
    revision: str,
    quant: str,
    files: list[HubFile],
    max_queue: int,
    key: idempotency.Key | None,
) -> tuple[response_store.Created, bool]:
    """Persist a pull: its response and task (``on_restart: resume``), its first events
    and its row, in one transaction. ``(created, joined)``: ``joined`` when an
    unfinished pull of the same reference was found and is returned instead."""
    running = unfinished(conn, ref, model_id, node)
    if running is not None:
        created = response_store.Created(running.response_id, running.id, 202, True)
        return created, True
    request = PreparedRequest(
        model=model_id,
        input=(),
        background=True,
        on_restart="resume",
        metadata={"lmsp_pull": ref},
    )
    created = response_store.create(
        conn,
        client_id=client_id,
        request=request,
        on_restart="resume",
        max_queue=max_queue,
        key=key,
    )
    if created.replayed:
        return created, True
    conn.execute(
        "INSERT INTO model_pulls (task_id, ref, model_id, node, repo, revision, quant, files,"
        " total_bytes, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            created.task_id,
            ref,
            model_id,
            node,
            repo,
            revision,
            quant,
            json.dumps([{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files]),
            sum(f.size for f in files),
            _now(),
        ),
    )
    return created, False


def waiting(conn: Conn, shared: bool) -> bool:
    """Might :func:`claim` find a pull (a read before its write)?"""
    held = " OR (t.status = 'running' AND t.node_id IS NULL)" if shared else ""
    found = conn.execute(
        "SELECT 1 FROM model_pulls p JOIN tasks t ON t.id = p.task_id"
        f" WHERE t.status = 'queued'{held} LIMIT 1"
    ).fetchone()
    return found is not None


def claim(conn: Conn, node: str, owner: Node | None) -> tuple[str, bool] | None:
    """Take this node's next pull: on a database nodes share, first one a restart left
    ``running`` with no holder (resumed from its bytes on disk; on a database of one
    node the runner gets those from recovery), else the oldest queued one, moved to
    ``loading``. ``(task id, resumed)``, or ``None``."""
    holder = (owner.id, owner.epoch) if owner is not None else (None, 0)
    lock = skip_locked(conn)
    for status in ("running", "queued") if owner is not None else ("queued",):
        nobody = " AND t.node_id IS NULL" if status == "running" else ""
        row = conn.execute(
            "UPDATE tasks SET node_id = ?, lease_epoch = ? WHERE id = ("
            "SELECT t.id FROM tasks t JOIN model_pulls p ON p.task_id = t.id"
            f" WHERE t.status = ? AND p.node = ?{nobody} ORDER BY t.seq LIMIT 1{lock})"
            " AND status = ? RETURNING id",
            (*holder, status, node, status),
        ).fetchone()
        if row is None:
            continue
        if status == "running":
            return str(row[0]), True
        if task_store.move(conn, row[0], Status.LOADING) is not None:
            return str(row[0]), False
    return None


def _running(conn: Conn, task_id: str) -> bool:
    task = task_store.get(conn, task_id)
    return task is not None and task.status is Status.RUNNING


def progress(
    conn: Conn, task_id: str, part: int, part_bytes: int, done: int, total: int, rate: float
) -> bool:
    """Record how far the pull got (``part_bytes`` of file ``part`` are synced on disk)
    and log ``model.pull.progress``; ``False`` (nothing written) once it is no longer
    ``running`` (a cancel won)."""
    if not _running(conn, task_id):
        return False
    conn.execute(
        "UPDATE model_pulls SET part = ?, part_bytes = ?, bytes_done = ? WHERE task_id = ?",
        (part, part_bytes, done, task_id),
    )
    events.append(
        conn,
        task_id,
        [{"type": PROGRESS, "bytes": done, "total": total, "rate": round(rate), "part": part}],
    )
    return True


def finish(
    conn: Conn, pull: Pull, *, digest: str, size: int, metadata: dict[str, Any]
) -> str | None:
    """Register the model and complete the pull, in one transaction: ``"completed"``,
    ``"cancelled"`` (a cancel won first), ``"exists"`` (the id was taken meanwhile: the
    task fails) or ``None`` (the task is no longer running)."""
    task_id = pull.task_id
    if not _running(conn, task_id):
        return "cancelled" if task_store.finish_cancel(conn, task_id) else None
    if models.get(conn, pull.model_id) is not None:
        task_store.fail(
            conn, task_id, "model_exists", f"A model {pull.model_id!r} exists meanwhile."
        )
        return "exists"
    models.add_hashed_gguf(conn, pull.model_id, digest, size, metadata)  # hashed as it came
    events.append(
        conn,
        task_id,
        [{"type": PROGRESS, "bytes": pull.total_bytes, "total": pull.total_bytes, "rate": 0}],
    )
    conn.execute("UPDATE model_pulls SET bytes_done = total_bytes WHERE task_id = ?", (task_id,))
    usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cached_tokens": 0}
    done = task_store.Completion([], [], usage)
    if task_store.complete(conn, task_id, done) is None:  # pragma: no cover - checked
        return None
    return "completed"


def active(conn: Conn) -> list[Row]:
    """Pulls unfinished, with their progress (the metrics)."""
    return list(
        conn.execute(
            "SELECT p.task_id, p.model_id, p.bytes_done, p.total_bytes, t.status"
            " FROM model_pulls p JOIN tasks t ON t.id = p.task_id"
            f" WHERE t.status IN ({UNFINISHED_SQL})"
        )
    )
