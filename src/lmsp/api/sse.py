"""Server-sent events from a task's log: replay from any sequence number, then live.

Events are always read from SQLite, so a stream shows exactly the committed log — the
same bytes before and after a restart. ``id:`` carries the sequence number, so
``Last-Event-ID`` resumes a stream too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse, ServerSentEvent

from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS
from lmsp.protocol.states import Status
from lmsp.store import events
from lmsp.store import tasks as task_store
from lmsp.store.db import Database

from .broker import Broker

PAGE = 500


class KeepAlive(ServerSentEvent):
    """A keep-alive: one comment line and no blank line after it.

    A blank line ends an event. After ``: ping`` it would end an *empty* one, and SSE
    parsers that keep the last event id (as the spec says), the openai SDK's among
    them, then hand that empty event to ``json.loads`` and fail. A lone comment line
    keeps the connection busy and changes no event.
    """

    def __init__(self) -> None:
        super().__init__(comment="ping")

    def encode(self) -> bytes:
        return b": ping\r\n"


async def task_events(
    db: Database, broker: Broker, task_id: str, after: int
) -> AsyncIterator[ServerSentEvent]:
    """Events of ``task_id`` after ``after`` until its terminal event."""
    last = after
    while True:
        waiter = broker.current()
        conn = db.reader()
        rows = events.after(conn, task_id, last, PAGE)
        for seq, kind, data in rows:
            yield ServerSentEvent(data=data, event=kind, id=str(seq))
            last = seq
            if kind in TERMINAL_EVENTS:
                return
        if rows:
            continue
        task = task_store.get(conn, task_id)
        if task is None or (
            Status(task["status"]).terminal and task["last_sequence_number"] <= last
        ):
            return
        await broker.wait(waiter, 10.0)


def event_response(
    source: AsyncIterator[ServerSentEvent],
    *,
    on_disconnect: Callable[[], None] | None = None,
    headers: dict[str, str] | None = None,
    ping: float = 15.0,
) -> EventSourceResponse:
    """Wrap a source; ``on_disconnect`` runs if the client leaves before the terminal event."""

    async def guarded() -> AsyncIterator[ServerSentEvent]:
        finished = False
        try:
            async for event in source:
                if event.event in TERMINAL_EVENTS:
                    finished = True
                yield event
            finished = True
        finally:
            if not finished and on_disconnect is not None:
                on_disconnect()

    return EventSourceResponse(
        guarded(), headers=headers, ping=ping, ping_message_factory=KeepAlive
    )
