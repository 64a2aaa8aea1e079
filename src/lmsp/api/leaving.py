"""A client that leaves before its answer: one rule for every route.

A request that is not ``background`` is made for the client that sent it and waits for
it. When that client disconnects before its answer (a timeout, a crash, ``Ctrl-C``, an
SDK that gives up and retries), nobody will read the answer: its work stops, as it
does for a stream. A task is cancelled (and charged what it consumed until then); an
embeddings request is dropped by its engine between two batches. A ``background``
request runs on: its client fetches the result later.

A stream notices the disconnect itself (:mod:`lmsp.api.sse`); a request that waits for
its whole answer waits with :func:`unless_gone`, which watches the connection while it
waits (the ASGI server says ``http.disconnect`` as soon as the connection closes) and
raises :class:`ClientGone` when the client leaves first (:func:`watch` hands a use
case that watch, :class:`lmsp.app.watch.Watch`). The app answers a
:class:`ClientGone` with ``499``, which nobody reads: the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from lmsp.app.watch import ClientGone, Watch

__all__ = ["CLIENT_CLOSED", "ClientGone", "unless_gone", "watch"]

T = TypeVar("T")

#: the status of an answer to a client that left (nginx's "client closed request")
CLIENT_CLOSED = 499


async def _left(request: Request) -> None:
    """Return once the client has disconnected (its body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def unless_gone(waiting: Awaitable[T], request: Request) -> T:
    """What ``waiting`` gives, or :class:`ClientGone` (``waiting`` cancelled) when the
    client that sent ``request`` disconnects first. The caller stops the work the
    answer was for; a cancellation of the caller itself (the server stopping) is no
    departure of the client and is passed on as it is."""
    work = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_left(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientGone()
    finally:
        for pending in (work, gone):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending


def watch(request: Request) -> Watch:
    """:func:`unless_gone` for ``request``, as a use case takes it."""

    async def watching(waiting: Awaitable[T], /) -> T:
        return await unless_gone(waiting, request)

    return watching
