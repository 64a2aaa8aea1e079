"""Streams of a revoked client end: within a second of the revoke, with an error event.

A token is checked when a request starts; an event stream lasts as long as its task.
:func:`until_revoked` wraps a stream's events and watches the client
(:func:`lmsp.app.follow.until_revoked`: the revoke's commit wakes it, and it checks at
least every ``check_every`` seconds). Once the client is revoked the stream sends one
``error`` event (``token_revoked``, no ``id:``, so it never moves a ``Last-Event-ID``)
and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import ServerSentEvent

from lmsp.api.sse import sse
from lmsp.app import follow
from lmsp.app.core import Core

CHECK_EVERY = 0.5
MESSAGE = "This client's token was revoked; the stream ends."


def revoked_event() -> ServerSentEvent:
    error = {"type": "authentication_error", "code": "token_revoked", "message": MESSAGE}
    data: dict[str, Any] = {"type": "error", "code": "token_revoked", "message": MESSAGE}
    data.update(param=None, error=dict(error, param=None))
    return sse(json.dumps(data, separators=(",", ":")), event="error")


async def until_revoked(
    source: AsyncIterator[ServerSentEvent],
    core: Core,
    client_id: str,
    *,
    on_revoked: Callable[[], None] | None = None,
    check_every: float = CHECK_EVERY,
) -> AsyncIterator[ServerSentEvent]:
    """``source``'s events while ``client_id`` holds a valid token; then the error event
    and the end (``on_revoked`` runs then, e.g. to cancel a task nobody may follow).

    The watch runs beside the stream; a wait for ``source``'s next event is an
    :func:`asyncio.timeout` with no deadline, which the watch brings forward to now
    when the client is revoked (no task a event to race the watch)."""
    events = source.__aiter__()
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Timeout] = []  # the wait for the next event, while it lasts

    def revoked(_: object) -> None:
        for wait in waiting:
            wait.reschedule(loop.time())

    watcher = asyncio.ensure_future(follow.until_revoked(core, client_id, check_every))
    watcher.add_done_callback(revoked)
    try:
        while not watcher.done():
            try:
                async with asyncio.timeout(None) as wait:
                    waiting.append(wait)
                    try:
                        event = await events.__anext__()
                    finally:
                        waiting.clear()
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not watcher.done():
                    raise  # not the watch's: the source's own
                break
            yield event
        yield revoked_event()
        if on_revoked is not None:
            on_revoked()
    finally:
        watcher.remove_done_callback(revoked)
        watcher.cancel()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                await aclose()
