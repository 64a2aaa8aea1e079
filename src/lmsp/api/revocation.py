"""Streams of a revoked client end: within a second of the revoke, with an error event.

A token is checked when a request starts; an event stream lasts as long as its task.
:func:`until_revoked` wraps a stream's events and watches the client's row: the revoke's
commit wakes it (the broker fires after every commit), and it checks at least every
``check_every`` seconds; it reads the client's row only when the ``clients`` table's
version (:class:`lmsp.store.db.Versions`) moved since its last read. Once the client is
revoked the stream sends one ``error`` event (``token_revoked``, no ``id:``, so it never
moves a ``Last-Event-ID``) and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import ServerSentEvent

from lmsp.api.sse import sse
from lmsp.app.broker import Broker
from lmsp.store import clients
from lmsp.store.db import Database

CHECK_EVERY = 0.5
CLIENTS = "clients"
MESSAGE = "This client's token was revoked; the stream ends."


def revoked(db: Database, client_id: str) -> bool:
    row = clients.get(db.reader(), client_id)
    return row is None or row["revoked_at"] is not None


def revoked_event() -> ServerSentEvent:
    error = {"type": "authentication_error", "code": "token_revoked", "message": MESSAGE}
    data: dict[str, Any] = {"type": "error", "code": "token_revoked", "message": MESSAGE}
    data.update(param=None, error=dict(error, param=None))
    return sse(json.dumps(data, separators=(",", ":")), event="error")


async def _watch(db: Database, broker: Broker, client_id: str, every: float) -> None:
    checked: int | None = None
    while True:
        waiter = broker.current()
        # the row is read again only when a client row changed since the last read (the
        # version is bumped before a revoke is answered); the read runs off the loop
        version = db.versions[CLIENTS]
        if version != checked:
            if await asyncio.to_thread(revoked, db, client_id):
                return
            checked = version
        await broker.wait(waiter, every)


async def until_revoked(
    source: AsyncIterator[ServerSentEvent],
    db: Database,
    broker: Broker,
    client_id: str,
    *,
    on_revoked: Callable[[], None] | None = None,
    check_every: float = CHECK_EVERY,
) -> AsyncIterator[ServerSentEvent]:
    """``source``'s events while ``client_id`` holds a valid token; then the error event
    and the end (``on_revoked`` runs then, e.g. to cancel a task nobody may follow)."""
    events = source.__aiter__()
    watcher = asyncio.ensure_future(_watch(db, broker, client_id, check_every))
    nxt: asyncio.Future[ServerSentEvent] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(events.__anext__())
            await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                break
            try:
                event = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield event
        yield revoked_event()
        if on_revoked is not None:
            on_revoked()
    finally:
        watcher.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await nxt
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                await aclose()
