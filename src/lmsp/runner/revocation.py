"""A revoked client's task runs no further step.

A revoke cancels the client's unfinished tasks in its own transaction, and a create
checks the client in its transaction (:func:`lmsp.store.clients.ensure_active`), so
normally no task of a revoked client is left to run. The runner checks once more, in the
transaction of each step it writes (the start or resume, every flush of output): a task
whose client is revoked raises :class:`ClientRevoked`, nothing of that step is written,
and the runner **cancels** the task (``cancelling`` → ``cancelled``, as the revoke
itself would have), so its events end with ``response.cancelled``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lmsp.errors import LmspError
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn

T = TypeVar("T")


class ClientRevoked(LmspError):
    def __init__(self, task_id: str) -> None:
        super().__init__("token_revoked", f"The client of task {task_id} was revoked.")
        self.task_id = task_id


def check(conn: Conn, task_id: str) -> None:
    """Raise :class:`ClientRevoked` if the task's client is revoked (or gone)."""
    row = conn.execute(
        "SELECT c.revoked_at FROM tasks t JOIN clients c ON c.id = t.client_id WHERE t.id = ?",
        (task_id,),
    ).fetchone()
    if row is None or row[0] is not None:
        raise ClientRevoked(task_id)


def guarded(task_id: str, job: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """``job`` preceded, in its transaction, by :func:`check`."""

    def run(conn: Conn) -> T:
        check(conn, task_id)
        return job(conn)

    return run


def cancel(conn: Conn, task_id: str, usage: dict[str, int] | None = None) -> None:
    """The runner's end of a task whose client was revoked: cancelled, through the
    guarded moves (a task finished meanwhile stays as it is), charged ``usage``."""
    task_store.cancel(conn, task_id)
    task_store.finish_cancel(conn, task_id, usage)
