"""Startup recovery (chapter 11.3): runs before the listener accepts.

Every ``queued``, ``loading``, ``running`` and ``cancelling`` task left over is moved by
its ``on_restart`` policy, each move and its event in one transaction:

=============  ===========  ==========  =========================
found          fail         retry       resume
=============  ===========  ==========  =========================
queued         failed       queued      queued
loading        failed       queued      queued
running        failed       queued      running (from snapshot)
cancelling     cancelled    cancelled   cancelled
=============  ===========  ==========  =========================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmsp.protocol.states import Policy, Status, recovery_target
from lmsp.store import nodes
from lmsp.store import tasks as task_store
from lmsp.store.db import Database
from lmsp.store.sql import Conn

RESTART_MESSAGE = "The service restarted while this task was unfinished."


@dataclass
class Report:
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    kept_queued: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    # ``(on_restart policy, outcome)`` of every task found unfinished (for the metrics)
    outcomes: list[tuple[str, str]] = field(default_factory=list)


def recover_task(
    conn: Conn,
    task_id: str,
    report: Report,
    code: str = "server_restarted",
    message: str = RESTART_MESSAGE,
    usage: dict[str, int] | None = None,
) -> None:
    """Apply the table to one task, inside the caller's transaction (``code`` and
    ``message`` are the error of a task the table fails; ``usage``, what it consumed,
    when its runner knows: else its snapshot says, see :func:`lmsp.store.tasks.move`)."""
    task = task_store.get(conn, task_id)
    if task is None:
        return
    found = task.status
    if found.terminal:
        return
    policy = task.on_restart
    target = recovery_target(found, policy)
    only_from = frozenset({found})
    outcome: str | None = None
    if target is Status.FAILED:
        if task_store.fail(conn, task_id, code, message, only_from, usage):
            report.failed.append(task_id)
            outcome = "failed"
    elif target is Status.CANCELLED:
        if task_store.finish_cancel(conn, task_id, usage):
            report.cancelled.append(task_id)
            outcome = "cancelled"
    elif target is Status.RUNNING:
        task_store.release(conn, task_id)  # whichever node claims it next resumes it
        report.resumed.append(task_id)  # the runner continues it from its snapshot
        outcome = "resumed"
    elif found is Status.QUEUED:
        report.kept_queued.append(task_id)
        outcome = "kept_queued"
    else:
        reset = task.on_restart is Policy.RETRY
        if task_store.requeue(conn, task_id, reset=reset):
            report.requeued.append(task_id)
            outcome = "requeued"
    if outcome is not None:
        report.outcomes.append((policy.value, outcome))


def recover(db: Database, node_id: str | None = None) -> Report:
    """Scan the leftover tasks and apply each one's restart policy. On a database nodes
    share (``node_id`` given) while other nodes are up, only the tasks this node id held:
    the others' are theirs (or their rescuers'), and a queued task waits for any node.
    With no other node up, the whole cluster restarted: every leftover task, as on SQLite."""
    report = Report()
    conn = db.reader()
    if node_id is None or not nodes.others_alive(conn, node_id):
        found = task_store.unfinished(conn)
    else:
        found = nodes.own_unfinished(conn, node_id)
    for task in found:
        task_id = task.id

        def job(conn: Conn, task_id: str = task_id) -> None:
            recover_task(conn, task_id, report)

        db.write_sync(job)
    return report
