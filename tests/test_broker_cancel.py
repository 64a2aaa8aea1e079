"""A waiter of the broker that is cancelled as a commit wakes it is cancelled.

A request that is not streamed waits for its task's end through :meth:`Broker.wait`;
when its client leaves, the wait is cancelled and the task cancelled after it. Through
``asyncio.wait_for`` (Python 3.11) a cancellation that came just as a commit set the
event was dropped: the wait went on to the task's end, and the task ran to completion
for a client that had left (``make torture``'s charge campaign: a chat request left
before its first word generated all 24)."""

from __future__ import annotations

import asyncio

import pytest

from lmsp.app.broker import Broker


def test_a_wait_cancelled_as_its_event_is_set_is_cancelled() -> None:
    async def race() -> None:
        event = asyncio.Event()
        waiting = asyncio.ensure_future(Broker.wait(event, 10))
        await asyncio.sleep(0)  # the waiter waits
        event.set()  # a commit …
        waiting.cancel()  # … and the client's departure, in the same turn of the loop
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(race())


def test_a_wait_times_out_or_sees_its_event() -> None:
    async def both() -> tuple[bool, bool]:
        event = asyncio.Event()
        quiet = await Broker.wait(event, 0.01)
        event.set()
        return quiet, await Broker.wait(event, 10)

    assert asyncio.run(both()) == (False, True)
