"""An event stream's HTTP response, written straight to the ASGI server.

sse-starlette's ``EventSourceResponse`` ran every stream in an anyio task group of four
tasks (the events, the pings, the client's departure, the server's exit), with a lock
and a cancel scope around each write: for a short answer, more of the event loop's
time than its events (docs/performance.md). :class:`EventStream` does the same work
with one task beside the stream, the watch for the client's departure: the events are
written as the source gives them (each already framed as SSE, by
:mod:`lmsp.api.sse`'s event classes); a keep-alive goes every ``ping`` seconds from a
timer; a client that leaves, or a server that stops (:class:`OpenStreams`, from
:class:`Serving`'s shutdown), ends the stream at once, its source closed. Only a
client's departure is one (``on_departure``: a task nobody waits for any more is
cancelled): a stopping server leaves its tasks to recovery, as a crash does.

:class:`Serving` is ``lmsp serve``'s uvicorn server: it ends the open streams when it
stops, and settles the process's heap once it has started (:func:`settle_heap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from sse_starlette import ServerSentEvent
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]


class OpenStreams:
    """The event streams being written, so that a stopping server ends them at once
    (as their clients' departures) instead of waiting out its grace period for them."""

    def __init__(self) -> None:
        self._ends: set[Callable[[], None]] = set()
        self.stopping = False

    def add(self, end: Callable[[], None]) -> None:
        self._ends.add(end)

    def discard(self, end: Callable[[], None]) -> None:
        self._ends.discard(end)

    def end_all(self) -> None:
        self.stopping = True
        for end in list(self._ends):
            end()

    def __len__(self) -> int:
        return len(self._ends)


class Serving(uvicorn.Server):
    """uvicorn's server, whose shutdown first ends the app's open event streams (they
    would keep their connections, and the shutdown, for its whole grace period), and
    whose start ends by settling the process's heap (:func:`settle_heap`)."""

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        settle_heap()

    async def shutdown(self, sockets: Any = None) -> None:
        kept = getattr(getattr(self.config.app, "state", None), "http", None)
        if kept is not None:
            kept.streams.end_all()
        await super().shutdown(sockets)


#: the collector's thresholds once the server runs: a young collection every 50,000
#: allocations (Python's default: 700), an older one every 20 of those, a full one every
#: 20 of those
GC_THRESHOLDS = (50_000, 20, 20)


def settle_heap() -> None:
    """What the start built (modules, the app, its routes and schemas, the models'
    records) is collected once and frozen out of the collector's sight, and collections
    come rarer: a request allocates thousands of short-lived objects, and the default
    thresholds had the collector walk them (and the long-lived heap, at each full
    collection) for ~3 % of the API process's CPU at the creates' peak
    (docs/performance.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class EventStream(Response):
    """``source``'s events, written as they come; ``headers`` besides SSE's own;
    ``keepalive()`` written every ``ping`` seconds. A starlette ``Response`` (a route
    returns it as it is), none of whose body machinery it uses."""

    media_type = "text/event-stream"

    def __init__(
        self,
        source: AsyncIterator[ServerSentEvent],
        *,
        headers: dict[str, str] | None,
        ping: float,
        keepalive: Callable[[], ServerSentEvent],
        on_departure: Callable[[], None] = lambda: None,
    ) -> None:
        self.source = source
        self.on_departure = on_departure
        self.ping = ping
        self.keepalive = keepalive
        given = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        names = {k for k, _ in given}
        self.raw_headers = [*given, *(h for h in _HEADERS if h[0] not in names)]
        self.status_code = 200
        self.background = None
        self.body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        task = asyncio.current_task()
        assert task is not None
        ended: list[str] = []  # why it ended: "left" or "stopping" early, else "over"

        def end(why: str = "stopping") -> None:
            if not ended:
                ended.append(why)
                task.cancel()

        def left(_: object) -> None:
            end("left")

        streams = _open_streams(scope)
        watch = asyncio.ensure_future(_departure(receive))
        watch.add_done_callback(left)
        pings = _Pings(send, self.keepalive, self.ping)
        if streams is not None:
            streams.add(end)
            if streams.stopping:
                end()
        departed = False  # the client's loss: it left, or its stream broke off
        try:
            async for event in self.source:
                await send(
                    {"type": "http.response.body", "body": event.encode(), "more_body": True}
                )
            await pings.stop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not ended:
                raise  # not ours: the server's own cancellation goes on
            task.uncancel()
            await pings.stop()
            departed = ended[0] == "left"
            if not departed:  # the server stops, its client still there: a clean end
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except BaseException:
            departed = True
            raise
        finally:
            ended.append("over")  # a departure or a stop from now on is none of its own
            if streams is not None:
                streams.discard(end)
            watch.remove_done_callback(left)
            watch.cancel()
            pings.cancel()
            await _close(self.source)
            if departed:
                self.on_departure()


class _Pings:
    """A keep-alive written every ``every`` seconds from a timer (no task of its own
    while it waits), stopped before the response's last write."""

    def __init__(self, send: Send, keepalive: Callable[[], ServerSentEvent], every: float) -> None:
        self.send = send
        self.keepalive = keepalive
        self.every = every
        self.loop = asyncio.get_running_loop()
        self.writing: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        if every > 0:
            self.timer = self.loop.call_later(every, self._due)

    def _due(self) -> None:
        body = self.keepalive().encode()
        self.writing = asyncio.ensure_future(
            self.send({"type": "http.response.body", "body": body, "more_body": True})
        )
        self.timer = self.loop.call_later(self.every, self._due)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.writing is not None:
            self.writing.cancel()

    async def stop(self) -> None:
        """No keep-alive after this: one being written is let finish first."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.writing is not None and not self.writing.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self.writing)


async def _departure(receive: Receive) -> None:
    """Return once the client has disconnected (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        continue


async def _close(source: AsyncIterator[ServerSentEvent]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(RuntimeError):
            await aclose()


def _open_streams(scope: Scope) -> OpenStreams | None:
    kept = getattr(getattr(scope.get("app"), "state", None), "http", None)
    return getattr(kept, "streams", None)
