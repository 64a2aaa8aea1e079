"""Tasks in queue verbs. Every status change is one guarded ``UPDATE … WHERE status IN``
plus its event rows plus the task's last sequence number, in the caller's transaction;
the row count says whether this caller won.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from lmsp.errors import client_message
from lmsp.ids import now as _now
from lmsp.protocol import events as ev
from lmsp.protocol import objects
from lmsp.protocol.assembler import items_from_events
from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.states import TERMINAL, UNFINISHED_SQL, Status, sources, sql_list
from lmsp.store import conversations, events, fairness, snapshots, webhooks
from lmsp.store import usage as ledger
from lmsp.store.nodes import Node
from lmsp.store.sql import POSTGRES, Conn, Row, clock_now, skip_locked, where

log = logging.getLogger(__name__)


def get(conn: Conn, task_id: str) -> TaskRecord | None:
    row = conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else TaskRecord.of(row)


def get_response(conn: Conn, response_id: str) -> ResponseRecord | None:
    row = conn.execute("SELECT * FROM responses WHERE id = ?", (response_id,)).fetchone()
    return None if row is None else ResponseRecord.of(row)


#: ``service_tier`` → the task's tier in the claim order (higher first)
TIERS = {"priority": 2, "default": 1, "auto": 1, "flex": 0}
DEFAULT_TIER = TIERS["default"]

#: each client's tasks holding a sequence (loading, running, cancelling)
_RUNNING = (
    "SELECT client_id, count(*) AS n FROM tasks"
    " WHERE status IN ('loading', 'running', 'cancelling') GROUP BY client_id"
)


def queue_position(conn: Conn, task: TaskRecord) -> int | None:
    """Where a queued task stands in the fair order the claim follows (1: next)."""
    if task.status is not Status.QUEUED:
        return None
    return fairness.position(conn, task.id)


def queued_count(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) FROM tasks WHERE status = 'queued'").fetchone()[0])


def output_items(conn: Conn, response: ResponseRecord, task_id: str) -> list[dict[str, Any]]:
    """The response's output: stored once its task finished, else what its log says."""
    if response.output is not None:
        return list(response.output)
    return items_from_events(events.output_events(conn, task_id))


def render_response(conn: Conn, task: TaskRecord) -> dict[str, Any]:
    response = get_response(conn, task.response_id)
    assert response is not None
    return objects.render_response(
        response, task, output_items(conn, response, task.id), queue_position(conn, task)
    )


def _seal_output(conn: Conn, task: TaskRecord) -> None:
    """A task reached a terminal state: keep its output items with the response (items
    still open are ``incomplete``: a cancel or a failure stopped them)."""
    response = get_response(conn, task.response_id)
    assert response is not None
    if response.output is not None:
        return
    items = closed(output_items(conn, response, task.id))
    conn.execute("UPDATE responses SET output = ? WHERE id = ?", (_dumps(items), response.id))


def closed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` as a finished response holds them: none ``in_progress`` (one still open
    when the task ended is ``incomplete``)."""
    return [
        {**item, "status": "incomplete"} if item.get("status") == "in_progress" else item
        for item in items
    ]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def move(
    conn: Conn,
    task_id: str,
    target: Status,
    *,
    from_states: frozenset[Status] | None = None,
    sets: dict[str, Any] | None = None,
    before: list[dict[str, Any]] | None = None,
    event_type: str | None = None,
    extra: dict[str, Any] | None = None,
    emit: bool = True,
    usage: dict[str, int] | None = None,
    sealed: bool = False,
) -> TaskRecord | None:
    """Move a task to ``target`` if it is in one of ``from_states``.

    Returns the task as updated, or ``None`` when another transition won first (nothing is
    written then). ``before`` events are logged ahead of the lifecycle event. A terminal
    move records ``usage`` with the response (what the task consumed, however it
    ended: completed, cancelled or failed), else what its snapshot says it generated,
    and the ledger counts it (:func:`lmsp.store.usage.record_finished`). ``sealed``: the
    response's output is stored already (:func:`complete`), so nothing reads the log for
    it and ``before`` goes with the lifecycle event in one append.
    """
    allowed = sources(target) if from_states is None else from_states
    if not allowed:
        raise ValueError(f"no transition leads to {target}")
    if target in TERMINAL and usage is None:  # read before the move clears the snapshot
        usage = snapshots.spent(conn, task_id)
    stamp = clock_now(conn)  # the database's clock: retention ages finished_at by it
    fields: dict[str, Any] = {"status": target.value, "updated_at": stamp}
    if target in TERMINAL:  # nothing resumes a finished task: its snapshot goes
        fields["finished_at"] = stamp
        fields["snapshot"] = None
    fields.update(sets or {})
    assignments = ", ".join(f"{name} = ?" for name in fields)
    states = sql_list(allowed)
    moved = conn.execute(
        f"UPDATE tasks SET {assignments} WHERE id = ? AND status IN ({states}) RETURNING *",
        (*fields.values(), task_id),
    ).fetchone()
    if moved is None:
        return None
    row = TaskRecord.of(moved)
    if "snapshot" in fields and fields["snapshot"] is None:
        snapshots.clear(conn, task_id)  # the chunks go with the snapshot that counts them
    batch = list(before or [])
    if target in TERMINAL:
        if batch and not sealed:  # the closing output events belong to the sealed output
            last = events.append(conn, task_id, batch)
            row = msgspec.structs.replace(row, last_sequence_number=last)
            batch = []
        if usage is not None:
            conn.execute(
                "UPDATE responses SET usage = ? WHERE id = ? AND usage IS NULL",
                (_dumps(usage), row.response_id),
            )
        _seal_output(conn, row)
        ledger.record_finished(conn, row)  # the ledger counts it in this transaction
        webhooks.enqueue(conn, row, event_type or ev.LIFECYCLE[target])  # the outbox
        conversations.on_finished(conn, row, target)  # the turn joins its conversation
    if emit:
        kind = event_type or ev.LIFECYCLE[target]
        batch.append(ev.lifecycle(kind, render_response(conn, row), **(extra or {})))
    if batch:  # the row as it now is: its counter moved with the events, nothing else did
        last = events.append(conn, task_id, batch)
        row = msgspec.structs.replace(row, last_sequence_number=last)
    return row


# -- the runner's verbs -----------------------------------------------------------------


def claim_next(
    conn: Conn,
    node: Node | None = None,
    digests: list[str] | None = None,
    *,
    newcomer: bool = False,
) -> TaskRecord | None:
    """Take the next task: on a shared database (``node`` given) first a task a lost
    node left ``running`` to resume (it stays ``running``: the runner resumes it),
    then the next queued one in the fair order (PROTOCOL.md 13), moved to ``loading``:
    the highest service tier first (priority, default, flex); within it the client
    with the fewest tasks running (a client at its ``max_running`` is passed over),
    ties to the client served longest ago; within a client FIFO. The claim is one
    ``UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1)``: nodes claiming
    at once pass over each other's rows; the task records ``(node, lease epoch)``.
    ``digests``: the model blobs this node has; a task of another model is left to the
    nodes that have it. ``newcomer``: the claim of the reserved sequence, which takes
    only a task of a client with nothing running, of the default tier or above (a
    ``flex`` task waits for a sequence of its own) and with no task of a higher tier
    queued (a ``priority`` task waiting for a sequence comes first)."""
    owner = (node.id, node.epoch) if node is not None else (None, 0)
    lock = skip_locked(conn)
    # the client's row: a lock its tasks' key checks (FOR KEY SHARE) do not wait for
    turn_lock = lock.replace("FOR UPDATE", "FOR NO KEY UPDATE")
    models = ""  # this node's models only
    args: tuple[Any, ...] = ()
    if digests is not None:
        marks = ", ".join("?" * len(digests)) or "NULL"
        models = (
            " AND response_id IN (SELECT r.id FROM responses r JOIN models m ON m.id = r.model"
            f" WHERE m.digest IN ({marks}))"
        )
        args = tuple(digests)
    turn = _NEWCOMER if newcomer else ""  # on the task's tier, its client's running count
    if node is not None and not newcomer:
        # (or cancelled since: the runner then finishes the cancel)
        resumed = conn.execute(
            "UPDATE tasks SET node_id = ?, lease_epoch = ? WHERE id = ("
            "SELECT id FROM tasks WHERE status IN ('running', 'cancelling')"
            f" AND node_id IS NULL{models} ORDER BY seq LIMIT 1{lock})"
            " AND status IN ('running', 'cancelling') AND node_id IS NULL RETURNING *",
            (*owner, *args),
        ).fetchone()
        if resumed is not None:
            return TaskRecord.of(resumed)
    row = conn.execute(
        "UPDATE tasks SET node_id = ?, lease_epoch = ? WHERE id = ("
        f"{_next_queued(conn, models, turn)}) AND status = 'queued' RETURNING id, client_id",
        (*owner, *args),
    ).fetchone()
    if row is None:
        return None
    # the client's turn: among clients running as many, the one served longest ago next.
    # Its row is passed over if another node's claim holds it (that claim moves the
    # turn on itself): a claim never waits for another's transaction
    conn.execute(
        "UPDATE clients SET served = (SELECT max(served) FROM clients) + 1"
        f" WHERE id = (SELECT id FROM clients WHERE id = ?{turn_lock})",
        (row[1],),
    )
    return move(conn, row[0], Status.LOADING)


#: the reserved sequence's claim: a client with nothing running, the default tier or
#: above, and no task of a higher tier waiting (the tiers' order holds for it too)
_NEWCOMER = (
    f" AND coalesce(r.n, 0) = 0 AND t.tier >= {DEFAULT_TIER} AND NOT EXISTS"
    " (SELECT 1 FROM tasks h WHERE h.status = 'queued' AND h.tier > t.tier)"
)


def _next_queued(conn: Conn, models: str, turn: str) -> str:
    """The ``SELECT`` of the next queued task's id in the fair order: ``models``, the
    condition on a task's own columns; ``turn``, on its tier and its client's running
    count (``t``, ``r``). On PostgreSQL a row lock each, passed over while another
    node claims it. On SQLite (one writer: no lock to pass over) the order is taken
    among each client's oldest queued task of each tier, the only one of its client
    and tier the order can pick, found by a skip scan of the ``tasks_queue`` index (a
    seek a client): a claim costs the same behind ten thousand queued tasks as behind
    ten, where ordering them all took 0.75 ms behind 1,300 (docs/performance.md)."""
    if conn.dialect == POSTGRES or models:
        return (
            "SELECT t.id FROM tasks t JOIN clients c ON c.id = t.client_id"
            f" LEFT JOIN ({_RUNNING}) r ON r.client_id = t.client_id"
            f" WHERE t.status = 'queued'{models}{turn}"
            " AND (c.max_running IS NULL OR coalesce(r.n, 0) < c.max_running)"
            " ORDER BY t.tier DESC, coalesce(r.n, 0), c.served, t.seq LIMIT 1"
            f"{skip_locked(conn).replace('FOR UPDATE', 'FOR UPDATE OF t')}"
        )
    return (
        f"WITH RECURSIVE g(tier, client_id, seq) AS ({_HEADS})"
        " SELECT t.id FROM (SELECT g.*, (SELECT count(*) FROM tasks x WHERE x.client_id ="
        " g.client_id AND x.status IN ('loading', 'running', 'cancelling')) AS n FROM g) r"
        f" JOIN tasks t ON t.seq = r.seq JOIN clients c ON c.id = r.client_id WHERE 1 = 1{turn}"
        " AND (c.max_running IS NULL OR r.n < c.max_running)"
        " ORDER BY r.tier DESC, r.n, c.served, r.seq LIMIT 1"
    )


#: each (tier, client)'s oldest queued task: the first, then from each the next
#: client of its tier, or else the first of the next tier (an index seek each)
_HEADS = (
    "SELECT * FROM (SELECT tier, client_id, seq FROM tasks WHERE status = 'queued'"
    " ORDER BY tier, client_id, seq LIMIT 1)"
    " UNION ALL SELECT t.tier, t.client_id, t.seq FROM g JOIN tasks t ON t.seq = coalesce("
    "(SELECT n.seq FROM tasks n WHERE n.status = 'queued' AND n.tier = g.tier"
    " AND n.client_id > g.client_id ORDER BY n.client_id, n.seq LIMIT 1),"
    " (SELECT n.seq FROM tasks n WHERE n.status = 'queued' AND n.tier > g.tier"
    " ORDER BY n.tier, n.client_id, n.seq LIMIT 1))"
)


def claimable(conn: Conn, shared: bool) -> bool:
    """Is any task waiting for a claim: one queued, or (``shared``: a database nodes
    share) one a lost node left ``running`` or ``cancelling`` for its next holder? A
    read before the write of :func:`claim_next`, which may still find none it may take."""
    waiting = "status = 'queued'"
    if shared:
        waiting += " OR (status IN ('running', 'cancelling') AND node_id IS NULL)"
    return conn.execute(f"SELECT 1 FROM tasks WHERE {waiting} LIMIT 1").fetchone() is not None


def release(conn: Conn, task_id: str) -> None:
    """Recovery left a task ``running`` to resume from its snapshot: no node holds it
    now, so the next node to claim (:func:`claim_next`) resumes it."""
    conn.execute("UPDATE tasks SET node_id = NULL WHERE id = ? AND status = 'running'", (task_id,))


def _record_digest(conn: Conn, task_id: str, digest: str | None) -> None:
    if digest:
        conn.execute(
            "UPDATE responses SET model_digest = ? WHERE id = (SELECT response_id FROM tasks"
            " WHERE id = ?)",
            (digest, task_id),
        )


def start(conn: Conn, task_id: str, model_digest: str | None) -> TaskRecord | None:
    """``loading → running`` once the model is ready; records which blob runs it."""
    task = get(conn, task_id)
    if task is None or task.status is not Status.LOADING:
        return None
    _record_digest(conn, task_id, model_digest)
    # a fresh run generates from the first token: no earlier snapshot may linger (a task
    # that never had one has no token chunks either: nothing to clear)
    sets = None if task.snapshot is None else {"snapshot": None}
    return move(conn, task_id, Status.RUNNING, sets=sets)


def mark_resumed(conn: Conn, task_id: str, model_digest: str | None) -> bool:
    """A task recovered in ``running`` is picked up again: log ``in_progress`` (resumed)."""
    task = get(conn, task_id)
    if task is None or task.status is not Status.RUNNING:
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


def append_output(
    conn: Conn, task_id: str, batch: list[dict[str, Any]], snapshot: dict[str, Any]
) -> bool:
    """Log a batch of output events and the snapshot covering them, if still ``running``.

    The snapshot is written in the same transaction as the events it covers, so a
    resume starts exactly after the last persisted event. ``snapshot["tokens"]`` is the
    whole list so far; only the tokens not yet stored are written (``snapshots``).
    Returns ``False`` (writing nothing) when the task is no longer running, e.g. a
    cancel won.
    """
    # the three columns it needs, not the whole typed record: this runs at every flush
    row = conn.execute(
        "SELECT status, last_sequence_number, snapshot FROM tasks WHERE id = ?", (task_id,)
    ).fetchone()
    if row is None or row[0] != Status.RUNNING.value:
        return False
    seq = events.append(conn, task_id, batch) if batch else int(row[1])
    previous = None if row[2] is None else snapshots.decode(row[2])
    return snapshots.write(conn, task_id, previous, snapshot, seq, _now())


def snapshot(conn: Conn, task_id: str) -> dict[str, Any] | None:
    """What a resume continues from: ``tokens`` (all so far), ``seed``, ``held`` and the
    ``sequence_number`` of the last event they cover; ``None`` when there is none."""
    return snapshots.read(conn, task_id)


@dataclass(frozen=True)
class Completion:
    """What a task completes with: the output's events not logged yet (its last text,
    its closing events), its final items, what it consumed and, if it stopped short, why
    (``max_output_tokens``, ...)."""

    closing: list[dict[str, Any]]
    output: list[dict[str, Any]]
    usage: dict[str, int]
    incomplete_reason: str | None = None


def complete(conn: Conn, task_id: str, done: Completion) -> TaskRecord | None:
    """``running → completed`` with the output's closing events and final items; loses
    (returns ``None``, writing nothing) if a cancel committed first."""
    task = get(conn, task_id)
    if task is None or task.status is not Status.RUNNING:
        return None
    conn.execute(
        "UPDATE responses SET output = ?, incomplete_reason = ? WHERE id = ?",
        (_dumps(closed(done.output)), done.incomplete_reason, task.response_id),
    )
    return move(
        conn,
        task_id,
        Status.COMPLETED,
        before=done.closing,
        event_type=ev.terminal_for(Status.COMPLETED, incomplete=bool(done.incomplete_reason)),
        usage=done.usage,
        sealed=True,
    )


def settle(conn: Conn, task_id: str, done: Completion) -> Status | None:
    """The runner's last word: complete the task, or, if a cancel committed first,
    finish that cancel (charged its usage all the same: the tokens were generated).
    Returns the terminal state reached (``None``: nothing to do)."""
    if complete(conn, task_id, done) is not None:
        return Status.COMPLETED
    if finish_cancel(conn, task_id, done.usage) is not None:
        return Status.CANCELLED
    return None


def fail(
    conn: Conn,
    task_id: str,
    code: str,
    message: str,
    from_states: frozenset[Status] | None = None,
    usage: dict[str, int] | None = None,
) -> TaskRecord | None:
    """Move a task to ``failed`` with its error (a message that shows a library's
    internals is logged and replaced: clients read it) and ``usage``, what it consumed
    before it failed (see :func:`move`)."""
    shown = client_message(message)
    if shown != message:
        log.warning("task %s failed: %s", task_id, message, extra={"task_id": task_id})
    message = shown
    return move(
        conn,
        task_id,
        Status.FAILED,
        from_states=from_states,
        sets={"error_code": code, "error_message": message},
        usage=usage,
    )


def cancel(conn: Conn, task_id: str) -> TaskRecord | None:
    """A cancel request: ``queued → cancelled`` or ``loading|running → cancelling``.

    Returns the task as moved, or ``None`` when the task was already past cancelling
    (finished, cancelling or cancelled): cancel is idempotent and changes nothing then.
    """
    moved = move(conn, task_id, Status.CANCELLED, from_states=frozenset({Status.QUEUED}))
    if moved is None:
        moved = move(conn, task_id, Status.CANCELLING)
    return moved


def finish_cancel(
    conn: Conn, task_id: str, usage: dict[str, int] | None = None
) -> TaskRecord | None:
    """``cancelling → cancelled``: the runner has stopped generating; ``usage``: what
    the task consumed until then (see :func:`move`)."""
    return move(
        conn,
        task_id,
        Status.CANCELLED,
        from_states=frozenset({Status.CANCELLING}),
        usage=usage,
    )


def requeue(conn: Conn, task_id: str, reset: bool) -> TaskRecord | None:
    """Recovery: put a ``loading``/``running`` task back in the queue, next attempt."""
    attempt = _attempt(conn, task_id) + 1
    sets: dict[str, Any] = {"attempt": attempt, "node_id": None}
    extra: dict[str, Any] = {"attempt": attempt}
    if reset:
        sets["snapshot"] = None
        extra["reset"] = True
    return move(conn, task_id, Status.QUEUED, sets=sets, extra=extra)


def _attempt(conn: Conn, task_id: str) -> int:
    row = conn.execute("SELECT attempt FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return int(row[0]) if row else 0


def unfinished(conn: Conn) -> list[TaskRecord]:
    return [
        TaskRecord.of(row)
        for row in conn.execute(
            f"SELECT * FROM tasks WHERE status IN ({UNFINISHED_SQL}) ORDER BY seq"
        )
    ]


def unfinished_of(conn: Conn, client_id: str) -> list[str]:
    """The ids of a client's unfinished tasks, oldest first (a revoke cancels them)."""
    return [
        row[0]
        for row in conn.execute(
            f"SELECT id FROM tasks WHERE client_id = ? AND status IN ({UNFINISHED_SQL})"
            " ORDER BY seq",
            (client_id,),
        )
    ]


def running_for_resume(conn: Conn) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM tasks WHERE status = 'running' AND on_restart = 'resume' ORDER BY seq"
        )
    ]


# -- reads for the API's lists and figures --------------------------------------------------


def of_response(conn: Conn, response_id: str) -> TaskRecord | None:
    row = conn.execute("SELECT * FROM tasks WHERE response_id = ?", (response_id,)).fetchone()
    return None if row is None else TaskRecord.of(row)


def page(
    conn: Conn, client_id: str | None, status: str | None, before_seq: int | None, limit: int
) -> list[TaskRecord]:
    """Tasks newest first: of one client (or all), in one status (or any), before a
    queue position (the list's cursor)."""
    clause, args = where(
        ("client_id = ?", client_id), ("status = ?", status), ("seq < ?", before_seq)
    )
    return [
        TaskRecord.of(row)
        for row in conn.execute(
            f"SELECT * FROM tasks{clause} ORDER BY seq DESC LIMIT ?", (*args, limit)
        )
    ]


def status_counts(conn: Conn) -> dict[str, int]:
    """How many tasks are stored in each status."""
    return {
        str(r[0]): int(r[1])
        for r in conn.execute("SELECT status, count(*) FROM tasks GROUP BY status")
    }


def queue_summary(conn: Conn) -> tuple[int, int | None]:
    """Tasks queued, and when the oldest of them was created."""
    row = conn.execute(
        "SELECT count(*), min(created_at) FROM tasks WHERE status = 'queued'"
    ).fetchone()
    return int(row[0]), None if row[1] is None else int(row[1])


def waiting(conn: Conn, limit: int) -> list[Row]:
    """The first ``limit`` tasks not generating yet, loading ones then queued ones in
    about the order the claim takes them, each with its model, its client's
    ``max_running`` and how many of that client's tasks run (``running``)."""
    return list(
        conn.execute(
            "SELECT t.id, t.response_id, t.client_id, t.status, t.created_at, r.model,"
            " c.max_running, coalesce(n.n, 0) AS running FROM tasks t"
            " JOIN responses r ON r.id = t.response_id JOIN clients c ON c.id = t.client_id"
            f" LEFT JOIN ({_RUNNING}) n ON n.client_id = t.client_id"
            " WHERE t.status IN ('loading', 'queued')"
            " ORDER BY t.status = 'queued', t.tier DESC, coalesce(n.n, 0), c.served, t.seq"
            " LIMIT ?",
            (limit,),
        )
    )


def running_count(conn: Conn) -> int:
    """Tasks holding a sequence (or loading to), on every node."""
    row = conn.execute(
        "SELECT count(*) FROM tasks WHERE status IN ('loading', 'running', 'cancelling')"
    ).fetchone()
    return int(row[0])


def unfinished_by_client(conn: Conn) -> list[dict[str, Any]]:
    """Each client with unfinished tasks: how many, running and queued."""
    return [
        {
            "id": row["id"],
            "name": row["name"],
            "unfinished": int(row["unfinished"]),
            "running": int(row["running"] or 0),
            "queued": int(row["queued"] or 0),
            "last_used_at": row["last_used_at"],
        }
        for row in conn.execute(
            "SELECT c.id, c.name, c.last_used_at, count(t.id) AS unfinished,"
            " sum(CASE WHEN t.status IN ('loading', 'running', 'cancelling') THEN 1 ELSE 0 END)"
            " AS running, sum(CASE WHEN t.status = 'queued' THEN 1 ELSE 0 END) AS queued"
            " FROM tasks t JOIN clients c ON c.id = t.client_id"
            f" WHERE t.status IN ({UNFINISHED_SQL}) GROUP BY c.id, c.name, c.last_used_at"
            " ORDER BY c.name, c.id"
        )
    ]
