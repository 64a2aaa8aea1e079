"""Following a task: its log's events from any sequence number, then live ones until its
terminal event; and the revocation of the client that follows it, which ends the
following.

A follower sees exactly the committed log — the same bytes before and after a restart:
what this process committed last comes from the writer's tail of each task's log
(:mod:`lmsp.store.tail`, the rows as inserted, published once committed), anything else
from the database. A follower reads again only when its task changed since its last
read: it waits on its task's stamp, which the broker checks after each commit, so a
commit wakes only the followers of the tasks it changed (a task whose stamp is not known
wakes on every commit). A transport frames what it reads
(HTTP: server-sent events, :mod:`lmsp.api.sse`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection
from typing import Any

from lmsp.app.core import Core
from lmsp.protocol import events as ev
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS
from lmsp.protocol.records import TaskRecord
from lmsp.store import clients, events
from lmsp.store import tasks as task_store

PAGE = 500
#: the table whose version moves when a client row changes (a revoke)
CLIENTS = "clients"


async def task_events(
    core: Core, task_id: str, after: int, hide: Collection[str] = ()
) -> AsyncIterator[tuple[int, str, str]]:
    """``(sequence number, type, JSON)`` of ``task_id``'s events after ``after`` until its
    terminal event. Types in ``hide`` are skipped (they keep their numbers in the log)."""
    async for page in task_pages(core, task_id, after, hide):
        for row in page:
            yield row


async def task_pages(
    core: Core, task_id: str, after: int, hide: Collection[str] = ()
) -> AsyncIterator[list[tuple[int, str, str]]]:
    """:func:`task_events`' events as they are read: each read's events together (what
    one commit or more added since the last read), never an empty list; a transport may
    send each list as one write."""
    db, broker = core.db, core.broker
    assert broker is not None
    versions = db.versions

    def probe() -> int | None:
        return versions.task(task_id)

    last = after
    seen: int | None = None
    while True:
        waiter = broker.current()
        # read only when this task changed since the last read (its stamp, taken before
        # the read), or when its stamp is unknown
        stamp = probe()
        if stamp is not None and stamp == seen:
            await broker.wait_change(probe, stamp, 10.0)
            continue
        # what this process just committed, else a read of the database
        rows, over = db.tail.after(task_id, last) or [], False
        if not rows:
            rows, over = await asyncio.to_thread(_page, core, task_id, last)
        seen = stamp if len(rows) < PAGE else None
        page: list[tuple[int, str, str]] = []
        ended = False
        for seq, kind, data in rows:
            last = seq
            if kind not in hide:
                page.append((seq, kind, data))
            if kind in TERMINAL_EVENTS:
                ended = True
                break
        if page:
            yield page
        if ended:
            return
        if rows:
            continue
        if over:
            return
        if stamp is None:  # not known: the next commit, whichever task it changed
            await broker.wait(waiter, 10.0)


def _page(core: Core, task_id: str, last: int) -> tuple[list[tuple[int, str, str]], bool]:
    """The next page of events after ``last`` (in a reader thread, off the event loop);
    with none, whether the log is over (the task is gone, or finished and all read)."""
    conn = core.db.reader()
    rows = events.after(conn, task_id, last, PAGE)
    if rows:
        return rows, False
    task = task_store.get(conn, task_id)
    over = task is None or (task.status.terminal and task.last_sequence_number <= last)
    return rows, over


def attempt_start(core: Core, task: TaskRecord) -> int:
    """Where a follower that translates the log starts (in a reader thread): before the
    last ``reset`` of a retried task (the output before it is void), else at the start
    of the log."""
    if task.attempt <= 1:
        return -1
    conn = core.db.reader()
    start = last = -1
    while rows := events.after(conn, task.id, last, 1000):
        for seq, kind, data in rows:
            last = seq
            if kind == ev.QUEUED and json.loads(data).get("reset"):
                start = seq - 1
    return start


def closing_events(core: Core, task_id: str, count: int) -> list[dict[str, Any]]:
    """The last ``count`` events of a task's log (in a reader thread)."""
    conn = core.db.reader()
    task = task_store.get(conn, task_id)
    if task is None:
        return []
    since = max(-1, task.last_sequence_number - count)
    return [json.loads(data) for _, _, data in events.after(conn, task_id, since, count + 1)]


# -- a revoked client's following ends ------------------------------------------------------
def revoked(core: Core, client_id: str) -> bool:
    row = clients.get(core.db.reader(), client_id)
    return row is None or row["revoked_at"] is not None


async def until_revoked(core: Core, client_id: str, every: float) -> None:
    """Return once ``client_id`` is revoked: the revoke's commit wakes the watch (the
    broker fires after every commit), which checks at least every ``every`` seconds and
    reads the client's row only when the ``clients`` table's version moved since its
    last read (the version is bumped before a revoke is answered); a commit that did
    not move it does not wake the watch."""
    db, broker = core.db, core.broker
    assert broker is not None
    versions = db.versions

    def probe() -> int:
        return versions[CLIENTS]

    checked: int | None = None
    while True:
        version = probe()
        if version != checked:
            if await asyncio.to_thread(revoked, core, client_id):
                return
            checked = version
        await broker.wait_change(probe, checked, every)
