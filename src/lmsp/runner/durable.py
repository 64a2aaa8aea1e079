"""Writes the runner must not lose, and tasks whose run broke off.

When a write fails for lack of space, the runner cannot drop it: a task whose ``fail``
or ``complete`` never commits stays ``running`` forever, a cancel of it stays
``cancelling``, and a client waiting on it never hears back.
:func:`lmsp.store.retrying.write_until_done` retries such a write with exponential
backoff until it commits (or the service shuts down: then the task is left for startup
recovery, as after a crash). While writes fail, the data directory's
:class:`lmsp.store.health.StorageHealth` is ``degraded`` (the writer says so), the
runner takes no new task and probes the storage with
:func:`lmsp.store.retrying.probe` instead, and ``/healthz`` reports it.

A task whose run broke off because a write failed, or because its engine process died
(``engine_crashed``), is settled by :func:`settle_interrupted`: its ``on_restart``
policy decides, exactly as startup recovery would (chapter 11.3), without waiting for a
restart.
"""

from __future__ import annotations

from lmsp.runner.recovery import Report, recover_task
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn

STORAGE_MESSAGE = "The service's disk filled up while this task ran."


def settle_interrupted(
    conn: Conn,
    task_id: str,
    code: str = "insufficient_storage",
    message: str = STORAGE_MESSAGE,
    usage: dict[str, int] | None = None,
) -> str:
    """A task whose run broke off (a write of it failed, its engine process died):
    apply its ``on_restart`` policy as startup recovery does, in the caller's
    transaction; a task the policy fails (or cancels) gets ``code`` and ``message`` and is
    charged ``usage``, what it consumed before it broke off. Returns what
    became of it: ``failed``, ``cancelled``, ``requeued``, ``resume`` (still ``running``:
    run it again from its snapshot), ``queued`` or ``finished`` (nothing left to do)."""
    task = task_store.get(conn, task_id)
    if task is None or task.status.terminal:
        return "finished"
    report = Report()
    recover_task(conn, task_id, report, code, message, usage)
    for outcome, ids in (
        ("failed", report.failed),
        ("cancelled", report.cancelled),
        ("requeued", report.requeued),
        ("resume", report.resumed),
        ("queued", report.kept_queued),
    ):
        if ids:
            return outcome
    return "finished"
