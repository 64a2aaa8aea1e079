"""A task's log as a stream of one dialect's server-sent events: the log followed
(:mod:`lmsp.app.follow`), each event framed by the dialect (Responses events as stored,
or translated into chat chunks, completion chunks, Messages events), the stream ended
with an error event when its client is revoked (:mod:`lmsp.api.revocation`), and what a
client that leaves first leaves behind (:class:`lmsp.app.tasks.Departure`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable

from sse_starlette import ServerSentEvent

from lmsp.api.eventstream import EventStream
from lmsp.api.revocation import until_revoked
from lmsp.api.sse import Batch, KeepAlive, event_response
from lmsp.app import follow
from lmsp.app.core import Core
from lmsp.app.tasks import Departure
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS
from lmsp.store.clients import Client

#: a log event (its sequence number, type and JSON as stored) as the dialect's events
Frames = Callable[[int, str, str], Iterable[ServerSentEvent]]


def followed(
    core: Core,
    departure: Departure,
    frames: Frames,
    *,
    client: Client | None,
    start: int = -1,
    hide: Collection[str] = (),
    headers: dict[str, str] | None = None,
    done: bool = True,
    keepalive: type[ServerSentEvent] = KeepAlive,
    terminal: Collection[str] = TERMINAL_EVENTS,
) -> EventStream:
    """The log of ``departure``'s task after ``start`` (types in ``hide`` skipped) as
    ``frames`` makes it, the events of each read of the log sent together; ``client``:
    the follower whose revocation ends it (``None``: nobody's). See
    :func:`lmsp.api.sse.event_response` for the rest."""

    async def source() -> AsyncIterator[ServerSentEvent]:
        # the events of one read of the log go out as one write (a Batch)
        async for page in follow.task_pages(core, departure.task_id, start, hide):
            batch = [event for row in page for event in frames(*row)]
            if len(batch) == 1:
                yield batch[0]
            elif batch:
                yield Batch(batch, terminal)

    events = source()
    if client is not None:  # a revoked client's stream ends
        events = until_revoked(events, core, client.id, on_revoked=departure.left)
    return event_response(
        events,
        on_disconnect=departure.left,
        on_finish=departure.finished,
        done=done,
        headers=headers,
        ping=core.settings.sse_ping,
        keepalive=keepalive,
        terminal=terminal,
    )
