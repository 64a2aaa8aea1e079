"""Tasks: list, show and cancel them, read their event logs, wait for their end, and
what a client that stops following one leaves behind (PROTOCOL.md section 5).

A client sees its own tasks; ``admin`` (the owner) sees and cancels every client's, and
the task objects it gets name their ``client_id``."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from lmsp import errors
from lmsp.app.core import Core
from lmsp.protocol import objects
from lmsp.protocol.records import TaskRecord
from lmsp.protocol.states import Status
from lmsp.store import events, idempotency
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn

log = logging.getLogger("lmsp")


# -- lookups and pages (in a reader thread) --------------------------------------------------
def owned(core: Core, task_id: str, client: Client) -> TaskRecord:
    """The task if ``client`` may see it (its own; ``admin``: any), else ``404``."""
    task = task_store.get(core.db.reader(), task_id)
    if task is None or not client.oversees(task.client_id):
        raise errors.not_found("task", task_id)
    return task


def shown(core: Core, conn: Conn, task: TaskRecord, client: Client) -> dict[str, Any]:
    """The task object; an admin (who sees every client's tasks) also gets its owner.
    ``node``: the node holding (or that last held) the task when nodes share the
    database, ``null`` on a single machine (PROTOCOL.md section 5)."""
    obj = objects.render_task(task, task_store.queue_position(conn, task))
    obj["node"] = task.node_id if core.membership is not None else None
    if client.admin:
        obj["client_id"] = task.client_id
    return obj


def _current(core: Core, task_id: str, client: Client) -> dict[str, Any]:
    return shown(core, core.db.reader(), owned(core, task_id, client), client)


async def show(core: Core, task_id: str, client: Client) -> dict[str, Any]:
    return await core.read(_current, core, task_id, client)


@dataclass(frozen=True)
class Listing:
    """``GET /v1/tasks``: whose (``None``: the caller's own, or every client's for an
    admin), in which status, a page of ``limit`` after the task ``after``."""

    status: Status | None = None
    limit: int = 20
    after: str | None = None
    client_id: str | None = None


async def page(core: Core, client: Client, listing: Listing) -> dict[str, Any]:
    """A client's own tasks, newest first; ``admin`` lists every client's."""
    if listing.client_id is not None and not client.oversees(listing.client_id):
        raise errors.forbidden("admin")
    return await core.read(_page, core, client, listing)


def _page(core: Core, client: Client, listing: Listing) -> dict[str, Any]:
    conn = core.db.reader()
    before: int | None = None
    if listing.after is not None:
        cursor = task_store.get(conn, listing.after)
        if cursor is None or not client.oversees(cursor.client_id):
            raise errors.invalid(f"Unknown cursor {listing.after!r}.", param="after")
        before = cursor.seq
    wanted = listing.client_id
    owner = wanted or client.id if wanted is not None or not client.admin else None
    status = listing.status.value if listing.status else None
    rows = task_store.page(conn, owner, status, before, listing.limit + 1)
    data = [shown(core, conn, t, client) for t in rows[: listing.limit]]
    return objects.list_page(data, len(rows) > listing.limit)


async def find(core: Core, task_id: str, client: Client) -> TaskRecord:
    """The task if ``client`` may see it, else ``404`` (off the event loop)."""
    return await core.read(owned, core, task_id, client)


async def events_page(core: Core, task_id: str, after: int, limit: int) -> dict[str, Any]:
    """The task's log events after ``after``, a page of ``limit`` as JSON objects."""
    rows = await core.read(lambda: events.after(core.db.reader(), task_id, after, limit + 1))
    return {
        "object": "list",
        "data": [json.loads(data) for _, _, data in rows[:limit]],
        "has_more": len(rows) > limit,
    }


# -- cancelling ----------------------------------------------------------------------------
async def cancel_owned(
    core: Core, task_id: str, client: Client, key: idempotency.Key | None
) -> dict[str, Any]:
    """``POST /v1/tasks/{id}/cancel`` of a task :func:`find` found: cancel it (once
    per idempotency key) and answer it as it stands then."""
    if key is None or not await core.db.write(lambda c: idempotency.remember(c, key, task_id)):
        await cancel(core, task_id, wait=core.settings.cancel_wait)
    return await show(core, task_id, client)


async def cancel(core: Core, task_id: str, wait: float = 0.0) -> None:
    """Cancel; when the runner has to stop generating, wait up to ``wait`` seconds
    for it to have stopped (so the answer normally shows ``cancelled``)."""
    moved = await core.db.write(lambda c: task_store.cancel(c, task_id))
    if moved is not None:
        log.info(
            "task %s: cancel requested",
            task_id,
            extra={"event": "task.cancel_requested", "task_id": task_id},
        )
    _after_cancel(core, task_id, moved)
    if moved is not None and moved.status is Status.CANCELLING and wait > 0:
        await wait_finished(core, task_id, timeout=wait)


def cancel_nowait(core: Core, task_id: str) -> None:
    """Cancel from a context that cannot await (a stream whose client left)."""
    future = core.db.submit(lambda c: task_store.cancel(c, task_id))

    def done(f: Future[Any]) -> None:
        if f.exception() is None:
            _after_cancel(core, task_id, f.result())
        else:  # e.g. a full disk: the task runs on, as if the client had stayed
            log.warning("cancel of %s after a disconnect failed: %s", task_id, f.exception())

    future.add_done_callback(done)


def cancelled(core: Core, moved: list[TaskRecord], why: str) -> None:
    """After a commit that cancelled tasks (a revoke): the runner stops generating
    for those now ``cancelling``."""
    for task in moved:
        log.info(
            "task %s: cancel requested (%s)",
            task.id,
            why,
            extra={"event": "task.cancel_requested", "task_id": task.id},
        )
        _after_cancel(core, task.id, task)


def _after_cancel(core: Core, task_id: str, moved: TaskRecord | None) -> None:
    if moved is not None and moved.status is Status.CANCELLING:
        core.runner.request_cancel(task_id)


# -- the end of a task ---------------------------------------------------------------------
async def wait_finished(core: Core, task_id: str, timeout: float | None = None) -> bool:
    """Wait until the task is finished (or gone); ``False`` if ``timeout`` passed."""
    broker = core.broker
    assert broker is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: int | None = None
    while True:
        waiter = broker.current()
        stamp = core.db.versions.task(task_id)  # unchanged task: no read
        if stamp is None or stamp != seen:
            task = await core.read(lambda: task_store.get(core.db.reader(), task_id))
            if task is None or task.status.terminal:
                return True
            seen = stamp
        left = 10.0 if deadline is None else min(10.0, deadline - time.monotonic())
        if left <= 0:
            return False
        await broker.wait(waiter, left)


async def delete_when_finished(core: Core, task_id: str, response_id: str, client_id: str) -> None:
    """``store: false``: the response goes once its task has finished."""
    await wait_finished(core, task_id)
    await core.db.write(lambda c: response_store.delete(c, response_id, client_id))


def forget_later(core: Core, task_id: str, response_id: str, client_id: str) -> None:
    """:func:`delete_when_finished` from a context that cannot await."""
    core.later(delete_when_finished(core, task_id, response_id, client_id))


@dataclass(frozen=True)
class Departure:
    """What a client that stops following a task before its end leaves behind: the task
    cancelled (``cancel``: the client was the one waiting for it, not ``background``),
    and a ``store: false`` response (``forget``: its id and its client's) deleted once
    the task has stopped, as it is when the client follows it to its end."""

    core: Core
    task_id: str
    cancel: bool = True
    forget: tuple[str, str] | None = None

    def left(self) -> None:
        """The client left before the end (from a context that cannot await)."""
        if self.cancel:
            cancel_nowait(self.core, self.task_id)
        if self.forget is not None:
            forget_later(self.core, self.task_id, *self.forget)

    async def finished(self) -> None:
        """The client followed the task to its end."""
        if self.forget is not None:
            await delete_when_finished(self.core, self.task_id, *self.forget)
