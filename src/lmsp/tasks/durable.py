"""Writes the runner must not lose: terminal moves retried while the disk is full.

When a write fails for lack of space, the runner cannot drop it: a task whose ``fail``
or ``complete`` never commits stays ``running`` forever, a cancel of it stays
``cancelling``, and a client waiting on it never hears back. :func:`write_until_done`
retries such a write with exponential backoff until it commits (or the service shuts
down: then the task is left for startup recovery, as after a crash). While writes fail,
the data directory's :class:`lmsp.store.health.StorageHealth` is ``degraded`` (the
writer says so), the runner takes no new task and probes the storage with
:func:`probe` instead, and ``/healthz`` reports it.

A task whose run broke off because a write failed, or because its engine process died
(``engine_crashed``), is settled by :func:`settle_interrupted`: its ``on_restart``
policy decides, exactly as startup recovery would (chapter 11.3), without waiting for a
restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from lmsp.protocol.states import Status
from lmsp.store import service as config_store
from lmsp.store import tasks as task_store
from lmsp.store.db import Database
from lmsp.store.health import is_storage_error
from lmsp.store.sql import Conn

from .recovery import Report, recover_task

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_DELAY = 0.05
MAX_DELAY = 5.0
STORAGE_MESSAGE = "The service's disk filled up while this task ran."


class Backoff:
    """Delays that double from ``first`` up to ``most`` seconds."""

    def __init__(self, first: float = FIRST_DELAY, most: float = MAX_DELAY) -> None:
        self.first = first
        self.most = most
        self.current = first

    def next(self) -> float:
        delay = self.current
        self.current = min(self.current * 2, self.most)
        return delay

    def reset(self) -> None:
        self.current = self.first


def write_until_done(
    db: Database, job: Callable[[Conn], T], stop: threading.Event, what: str
) -> tuple[bool, T | None]:
    """Run ``job`` through the writer, retrying it while the disk is full.

    Returns ``(True, result)`` once it committed, or ``(False, None)`` if ``stop`` was
    set while it waited (shutdown: the task stays as it is, for startup recovery).
    Any other error is raised at once.
    """
    backoff = Backoff()
    retrying = False
    try:
        while True:
            try:
                return True, db.write_sync(job)
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
            if not retrying:
                retrying = True
                db.health.retry_started()
                log.warning("%s: the disk is full; retrying until it commits", what)
            if stop.wait(backoff.next()):
                return False, None
    finally:
        if retrying:
            db.health.retry_ended()


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
    if task is None or Status(task["status"]).terminal:
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


def probe(conn: Conn) -> None:
    """A small real write: does the storage take writes again?"""
    config_store.put(conn, "storage_probe", str(int(time.time())))
