"""Tasks in queue verbs. Every status change is one guarded ``UPDATE … WHERE status IN``
plus its event rows plus the task's last sequence number, in the caller's transaction;
the row count says whether this caller won.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from lmsp import objects
from lmsp.ids import now as _now
from lmsp.store import events
from lmsp.tasks.states import TERMINAL, UNFINISHED, Status, sources

LIFECYCLE_EVENT = {
    Status.QUEUED: "response.queued",
    Status.LOADING: "response.loading",
    Status.RUNNING: "response.in_progress",
    Status.CANCELLING: "response.cancelling",
    Status.COMPLETED: "response.completed",
    Status.FAILED: "response.failed",
    Status.CANCELLED: "response.cancelled",
}


def get(conn: sqlite3.Connection, task_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM tasks WHERE id = ?", (task_id,)
    ).fetchone()
    return row


def get_response(conn: sqlite3.Connection, response_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM responses WHERE id = ?", (response_id,)
    ).fetchone()
    return row


def queue_position(conn: sqlite3.Connection, task: sqlite3.Row) -> int | None:
    if task["status"] != Status.QUEUED:
        return None
    row = conn.execute(
        "SELECT count(*) FROM tasks WHERE status = 'queued' AND seq <= ?", (task["seq"],)
    ).fetchone()
    return int(row[0])


def queued_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM tasks WHERE status = 'queued'").fetchone()[0])


def render_response(conn: sqlite3.Connection, task: sqlite3.Row) -> dict[str, Any]:
    response = get_response(conn, task["response_id"])
    assert response is not None
    return objects.render_response(response, task, queue_position(conn, task))


def _in(states: frozenset[Status] | tuple[Status, ...]) -> str:
    return ",".join(f"'{s.value}'" for s in sorted(states))


def move(
    conn: sqlite3.Connection,
    task_id: str,
    target: Status,
    *,
    from_states: frozenset[Status] | None = None,
    sets: dict[str, Any] | None = None,
    before: list[dict[str, Any]] | None = None,
    event_type: str | None = None,
    extra: dict[str, Any] | None = None,
    emit: bool = True,
) -> sqlite3.Row | None:
    """Move a task to ``target`` if it is in one of ``from_states``.

    Returns the updated row, or ``None`` when another transition won first (nothing is
    written then). ``before`` events are logged ahead of the lifecycle event.
    """
    allowed = sources(target) if from_states is None else from_states
    if not allowed:
        raise ValueError(f"no transition leads to {target}")
    stamp = _now()
    fields = {"status": target.value, "updated_at": stamp}
    if target in TERMINAL:
        fields["finished_at"] = stamp
    fields.update(sets or {})
    assignments = ", ".join(f"{name} = ?" for name in fields)
    row: sqlite3.Row | None = conn.execute(
        f"UPDATE tasks SET {assignments} WHERE id = ? AND status IN ({_in(allowed)}) RETURNING *",
        (*fields.values(), task_id),
    ).fetchone()
    if row is None:
        return None
    batch = list(before or [])
    if emit:
        lifecycle: dict[str, Any] = {"type": event_type or LIFECYCLE_EVENT[target]}
        lifecycle.update(extra or {})
        lifecycle["response"] = render_response(conn, row)
        batch.append(lifecycle)
    if batch:
        events.append(conn, task_id, batch)
    return get(conn, task_id)


# -- the runner's verbs -----------------------------------------------------------------


def claim_next(conn: sqlite3.Connection) -> sqlite3.Row | None:
    """Take the oldest queued task (FIFO) and move it to ``loading``."""
    row = conn.execute(
        "SELECT id FROM tasks WHERE status = 'queued' ORDER BY seq LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    return move(conn, row[0], Status.LOADING)


def _record_digest(conn: sqlite3.Connection, task_id: str, digest: str | None) -> None:
    if digest:
        conn.execute(
            "UPDATE responses SET model_digest = ? WHERE id = (SELECT response_id FROM tasks"
            " WHERE id = ?)",
            (digest, task_id),
        )


def start(conn: sqlite3.Connection, task_id: str, model_digest: str | None) -> sqlite3.Row | None:
    """``loading → running`` once the model is ready; records which blob runs it."""
    task = get(conn, task_id)
    if task is None or task["status"] != Status.LOADING:
        return None
    _record_digest(conn, task_id, model_digest)
    return move(conn, task_id, Status.RUNNING)


def mark_resumed(conn: sqlite3.Connection, task_id: str, model_digest: str | None) -> bool:
    """A task recovered in ``running`` is picked up again: log ``in_progress`` (resumed)."""
    task = get(conn, task_id)
    if task is None or task["status"] != Status.RUNNING:
        return False
    _record_digest(conn, task_id, model_digest)
    moved = move(
        conn,
        task_id,
        Status.RUNNING,
        from_states=frozenset({Status.RUNNING}),
        extra={"resumed": True},
    )
    return moved is not None


def _text_part(response: sqlite3.Row, text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_start_events(response: sqlite3.Row) -> list[dict[str, Any]]:
    item = {
        "type": "message",
        "id": response["message_id"],
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {
            "type": "response.content_part.added",
            "item_id": response["message_id"],
            "output_index": 0,
            "content_index": 0,
            "part": _text_part(response, ""),
        },
    ]


def append_output(
    conn: sqlite3.Connection, task_id: str, deltas: list[str], snapshot: dict[str, Any]
) -> bool:
    """Log a batch of text deltas and the snapshot covering them, if still ``running``.

    The snapshot is written in the same transaction as the events it covers, so a
    resume starts exactly after the last persisted event. Returns ``False`` (writing
    nothing) when the task is no longer running, e.g. a cancel won.
    """
    task = get(conn, task_id)
    if task is None or task["status"] != Status.RUNNING:
        return False
    response = get_response(conn, task["response_id"])
    assert response is not None
    state = objects.load_json(task["snapshot"]) or {}
    batch: list[dict[str, Any]] = []
    if not state.get("output_started"):
        batch.extend(output_start_events(response))
    for delta in deltas:
        batch.append(
            {
                "type": "response.output_text.delta",
                "item_id": response["message_id"],
                "output_index": 0,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            }
        )
    seq = events.append(conn, task_id, batch) if batch else task["last_sequence_number"]
    snap = dict(snapshot, output_started=True, sequence_number=seq)
    cur = conn.execute(
        "UPDATE tasks SET snapshot = ?, updated_at = ? WHERE id = ? AND status = 'running'",
        (json.dumps(snap, separators=(",", ":")), _now(), task_id),
    )
    return cur.rowcount == 1


def complete(
    conn: sqlite3.Connection,
    task_id: str,
    text: str,
    usage: dict[str, int],
    incomplete_reason: str | None = None,
) -> sqlite3.Row | None:
    """``running → completed``; loses (returns ``None``) if a cancel committed first."""
    task = get(conn, task_id)
    if task is None or task["status"] != Status.RUNNING:
        return None
    response = get_response(conn, task["response_id"])
    assert response is not None
    conn.execute(
        "UPDATE responses SET output_text = ?, usage = ?, incomplete_reason = ? WHERE id = ?",
        (text, json.dumps(usage), incomplete_reason, response["id"]),
    )
    response = get_response(conn, task["response_id"])
    assert response is not None
    state = objects.load_json(task["snapshot"]) or {}
    before = [] if state.get("output_started") else output_start_events(response)
    part = _text_part(response, text)
    item = {
        "type": "message",
        "id": response["message_id"],
        "role": "assistant",
        "status": "incomplete" if incomplete_reason else "completed",
        "content": [part],
    }
    ref = {"item_id": response["message_id"], "output_index": 0, "content_index": 0}
    before += [
        {"type": "response.output_text.done", **ref, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **ref, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
    ]
    return move(
        conn,
        task_id,
        Status.COMPLETED,
        before=before,
        event_type="response.incomplete" if incomplete_reason else "response.completed",
    )


def settle(
    conn: sqlite3.Connection,
    task_id: str,
    text: str,
    usage: dict[str, int],
    incomplete_reason: str | None = None,
) -> Status | None:
    """The runner's last word: complete the task, or, if a cancel committed first,
    finish that cancel. Returns the terminal state reached (``None``: nothing to do)."""
    if complete(conn, task_id, text, usage, incomplete_reason) is not None:
        return Status.COMPLETED
    if finish_cancel(conn, task_id) is not None:
        return Status.CANCELLED
    return None


def fail(
    conn: sqlite3.Connection,
    task_id: str,
    code: str,
    message: str,
    from_states: frozenset[Status] | None = None,
) -> sqlite3.Row | None:
    return move(
        conn,
        task_id,
        Status.FAILED,
        from_states=from_states,
        sets={"error_code": code, "error_message": message},
    )


def cancel(conn: sqlite3.Connection, task_id: str) -> sqlite3.Row | None:
    """A cancel request: ``queued → cancelled`` or ``loading|running → cancelling``.

    Returns the moved row, or ``None`` when the task was already past cancelling
    (finished, cancelling or cancelled): cancel is idempotent and changes nothing then.
    """
    moved = move(conn, task_id, Status.CANCELLED, from_states=frozenset({Status.QUEUED}))
    if moved is None:
        moved = move(conn, task_id, Status.CANCELLING)
    return moved


def finish_cancel(conn: sqlite3.Connection, task_id: str) -> sqlite3.Row | None:
    """``cancelling → cancelled``: the runner has stopped generating."""
    return move(conn, task_id, Status.CANCELLED, from_states=frozenset({Status.CANCELLING}))


def requeue(conn: sqlite3.Connection, task_id: str, reset: bool) -> sqlite3.Row | None:
    """Recovery: put a ``loading``/``running`` task back in the queue, next attempt."""
    attempt = _attempt(conn, task_id) + 1
    sets: dict[str, Any] = {"attempt": attempt}
    extra: dict[str, Any] = {"attempt": attempt}
    if reset:
        sets["snapshot"] = None
        extra["reset"] = True
    return move(conn, task_id, Status.QUEUED, sets=sets, extra=extra)


def _attempt(conn: sqlite3.Connection, task_id: str) -> int:
    row = conn.execute("SELECT attempt FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return int(row[0]) if row else 0


def unfinished(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    return list(
        conn.execute(f"SELECT * FROM tasks WHERE status IN ({_in(UNFINISHED)}) ORDER BY seq")
    )


def running_for_resume(conn: sqlite3.Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM tasks WHERE status = 'running' AND on_restart = 'resume' ORDER BY seq"
        )
    ]
