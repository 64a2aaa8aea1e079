"""Server-sent events from a task's log: replay from any sequence number, then live.

Events are always read from SQLite, so a stream shows exactly the committed log — the
same bytes before and after a restart. ``id:`` carries the sequence number, so
``Last-Event-ID`` resumes a stream too. Lines end with ``\\n`` (PROTOCOL.md section 6):
some SSE parsers split only on ``\\n``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

from sse_starlette import EventSourceResponse, ServerSentEvent

from lmsp.app.broker import Broker
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS
from lmsp.protocol.states import Status
from lmsp.store import events
from lmsp.store import tasks as task_store
from lmsp.store.db import Database

PAGE = 500
SEP = "\n"
#: the last line of a ``/v1/responses`` (and chat completions) stream
DONE = "[DONE]"


def sse(data: str, event: str | None = None, event_id: str | None = None) -> ServerSentEvent:
    """One event, framed with ``\\n`` line endings."""
    return ServerSentEvent(data=data, event=event, id=event_id, sep=SEP)


class KeepAlive(ServerSentEvent):
    """A keep-alive: one comment line and no blank line after it.

    A blank line ends an event. After ``: ping`` it would end an *empty* one, and SSE
    parsers that keep the last event id (as the spec says), the openai SDK's among
    them, then hand that empty event to ``json.loads`` and fail. A lone comment line
    keeps the connection busy and changes no event.
    """

    def __init__(self) -> None:
        super().__init__(comment="ping", sep=SEP)

    def encode(self) -> bytes:
        return b": ping\n"


async def task_events(
    db: Database,
    broker: Broker,
    task_id: str,
    after: int,
    hide: Collection[str] = (),
) -> AsyncIterator[tuple[int, str, str]]:
    """``(sequence number, type, JSON)`` of ``task_id``'s events after ``after`` until its
    terminal event. Types in ``hide`` are skipped (they keep their numbers in the log)."""
    last = after
    seen: int | None = None
    while True:
        waiter = broker.current()
        # every commit wakes every stream: read only when this task changed since the
        # last read (its stamp, taken before the read), or when its stamp is unknown
        stamp = db.versions.task(task_id)
        if stamp is not None and stamp == seen:
            await broker.wait(waiter, 10.0)
            continue
        rows, over = await asyncio.to_thread(_page, db, task_id, last)
        seen = stamp if len(rows) < PAGE else None
        for seq, kind, data in rows:
            last = seq
            if kind not in hide:
                yield seq, kind, data
            if kind in TERMINAL_EVENTS:
                return
        if rows:
            continue
        if over:
            return
        await broker.wait(waiter, 10.0)


def _page(db: Database, task_id: str, last: int) -> tuple[list[tuple[int, str, str]], bool]:
    """The next page of events after ``last`` (in a reader thread, off the event loop);
    with none, whether the log is over (the task is gone, or finished and all read)."""
    conn = db.reader()
    rows = events.after(conn, task_id, last, PAGE)
    if rows:
        return rows, False
    task = task_store.get(conn, task_id)
    over = task is None or (
        Status(task["status"]).terminal and task["last_sequence_number"] <= last
    )
    return rows, over


async def framed(
    source: AsyncIterator[tuple[int, str, str]],
) -> AsyncIterator[ServerSentEvent]:
    """Log events as SSE: ``id:`` the sequence number, ``event:`` the payload's type."""
    async for seq, kind, data in source:
        yield sse(data, event=kind, event_id=str(seq))


class MessagesPing(ServerSentEvent):
    """The Messages API's keep-alive: an ``event: ping`` with ``{"type": "ping"}``, as
    Anthropic sends (its SDKs skip it)."""

    def __init__(self) -> None:
        super().__init__(data='{"type":"ping"}', event="ping", sep=SEP)


def event_response(
    source: AsyncIterator[ServerSentEvent],
    *,
    on_disconnect: Callable[[], None] | None = None,
    on_finish: Callable[[], Awaitable[None]] | None = None,
    done: bool = False,
    headers: dict[str, str] | None = None,
    ping: float = 15.0,
    keepalive: type[ServerSentEvent] = KeepAlive,
    terminal: Collection[str] = TERMINAL_EVENTS,
) -> EventSourceResponse:
    """Wrap a source. ``on_disconnect`` runs if the client leaves before the source ends
    (before an event named in ``terminal``); ``on_finish`` once it has ended; ``done``
    ends the stream with ``data: [DONE]``; ``keepalive`` is what an idle stream sends
    every ``ping`` seconds."""

    async def guarded() -> AsyncIterator[ServerSentEvent]:
        finished = False
        try:
            async for event in source:
                if event.event in terminal:
                    finished = True  # the client has all it needs even if it leaves now
                yield event
            finished = True
            if done:
                yield sse(DONE)
        finally:
            if not finished and on_disconnect is not None:
                on_disconnect()
        if on_finish is not None:
            await on_finish()

    return EventSourceResponse(
        guarded(), headers=headers, ping=ping, ping_message_factory=keepalive, sep=SEP
    )
