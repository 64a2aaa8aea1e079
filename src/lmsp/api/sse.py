"""Server-sent events from a task's log (read by :mod:`lmsp.app.follow`): replay from
any sequence number, then live.

``id:`` carries the sequence number, so ``Last-Event-ID`` resumes a stream too. Lines
end with ``\\n`` (PROTOCOL.md section 6): some SSE parsers split only on ``\\n``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence

from sse_starlette import ServerSentEvent

from lmsp.api.eventstream import EventStream
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS

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


class Stored(ServerSentEvent):
    """A log event as SSE, its JSON as stored: ``id:`` the sequence number, ``event:``
    the payload's type. Framed without a scan of its JSON for line breaks: compact JSON
    has none (a string's are escaped), which is checked once, cheaply."""

    def __init__(self, seq: int, kind: str, data: str) -> None:
        super().__init__(data=data, event=kind, id=str(seq), sep=SEP)

    def encode(self) -> bytes:
        data = str(self.data)
        if "\n" in data or "\r" in data:  # not compact JSON: framed line by line
            return super().encode()
        return f"id: {self.id}\nevent: {self.event}\ndata: {data}\n\n".encode()


def as_stored(seq: int, kind: str, data: str) -> list[ServerSentEvent]:
    """A log event as SSE, its JSON as stored (:class:`Stored`)."""
    return [Stored(seq, kind, data)]


class Batch(ServerSentEvent):
    """Several events sent as one write (the events one read of the log found): one
    pass through the ASGI stack and one socket write instead of one each. Its
    ``event`` is the first of them in ``terminal``, else the last one's."""

    def __init__(self, events: Sequence[ServerSentEvent], terminal: Collection[str]) -> None:
        kinds = [e.event for e in events]
        ends = [k for k in kinds if k in terminal]
        super().__init__(event=ends[0] if ends else kinds[-1], sep=SEP)
        self.events = events

    def encode(self) -> bytes:
        return b"".join(e.encode() for e in self.events)


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
) -> EventStream:
    """Wrap a source. ``on_disconnect`` runs if the client leaves before the source ends
    (before an event named in ``terminal``), not when the server stops (its tasks are
    left to recovery, as by a crash); ``on_finish`` once it has ended; ``done`` ends
    the stream with ``data: [DONE]``; ``keepalive`` is what an idle stream sends every
    ``ping`` seconds."""
    finished = False  # the client has all it needs even if it leaves now

    async def guarded() -> AsyncIterator[ServerSentEvent]:
        nonlocal finished
        async for event in source:
            finished = finished or event.event in terminal
            yield event
        finished = True
        if done:
            yield sse(DONE)
        if on_finish is not None:
            await on_finish()

    def departed() -> None:
        if not finished and on_disconnect is not None:
            on_disconnect()

    return EventStream(
        guarded(), headers=headers, ping=ping, keepalive=keepalive, on_departure=departed
    )
