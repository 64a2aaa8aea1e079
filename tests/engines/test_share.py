"""The pieces that share work fairly, without a server: the engine's time share between
generation and embeddings, the sandbox's queue (clients in turn), and a request's CPU
budget across its jobs."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

import numpy as np
import pytest

from lmsp.engines.core import EngineCore
from lmsp.engines.protocol import Cancel, Done, Embed, Embeddings, Shutdown
from lmsp.engines.share import EmbedShare
from lmsp.fairgate import FairGate, QueueTimeout, Ticket
from lmsp.sandbox import Overrun, Sandbox
from tests import sandbox_jobs


def test_embeddings_take_their_share_only_while_sequences_generate() -> None:
    share = EmbedShare(1 / 3)
    assert share.may_embed(generating=True)
    share.embedded(0.5, generating=True)  # owes 1 s of generation steps
    assert not share.may_embed(generating=True)
    share.stepped(0.6)
    assert not share.may_embed(generating=True)
    share.stepped(0.4)
    assert share.may_embed(generating=True)
    assert share.yielded == 2
    share.embedded(0.5, generating=True)
    assert share.may_embed(generating=False)  # nothing generates: the debt is forgiven
    share.embedded(0.5, generating=False)  # but a batch run meanwhile is owed to a newcomer
    assert not share.may_embed(generating=True)
    share.stepped(1.5)
    assert share.may_embed(generating=True)


def test_the_queue_takes_clients_in_turn() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(1)
        await gate.enter("hostile")  # the one slot is taken
        order: list[str] = []

        async def job(owner: str) -> None:
            await gate.enter(owner)
            order.append(owner)
            await asyncio.sleep(0)
            gate.leave()

        waiting = [asyncio.create_task(job("hostile")) for _ in range(6)]
        await asyncio.sleep(0)
        waiting.append(asyncio.create_task(job("bystander")))
        await asyncio.sleep(0)
        gate.leave()
        await asyncio.gather(*waiting)
        return order

    order = asyncio.run(scenario())
    assert order.index("bystander") <= 1, order  # not behind the six hostile jobs
    assert len(order) == 7


def test_a_wait_past_the_deadline_gives_up_and_passes_its_turn_on() -> None:
    async def scenario() -> None:
        gate = FairGate(1)
        await gate.enter("a")
        with pytest.raises(QueueTimeout):
            await gate.enter("b", deadline=time.monotonic() + 0.05)
        gate.leave()
        assert gate.free == 1 and gate.waiting() == 0

    asyncio.run(scenario())


def test_a_requests_jobs_share_one_cpu_budget() -> None:
    sandbox = Sandbox(1)
    try:

        async def scenario() -> None:
            ticket = Ticket("client", 0.5, time.monotonic() + 600)  # a deadline far off
            # each job alone may take 60 s (a busy machine's wall-clock limit is far off)
            assert await sandbox.run(sandbox_jobs.echo, 1, cpu_seconds=60, ticket=ticket) == 1
            with pytest.raises(Overrun) as spent:
                await sandbox.run(sandbox_jobs.spin, cpu_seconds=60, ticket=ticket)
            assert spent.value.limit == "request"  # the request's budget, not the job's
            with pytest.raises(Overrun) as nothing_left:
                await sandbox.run(sandbox_jobs.echo, 2, cpu_seconds=60, ticket=ticket)
            assert nothing_left.value.limit == "request"
            assert ticket.jobs == 2

        asyncio.run(scenario())
    finally:
        sandbox.close()


class OneAtATime:
    """A backend that embeds one input per batch (and generates nothing)."""

    n_ctx = 64
    sequences = 1
    max_step_tokens = 64

    def embed(
        self, inputs: list[list[int]], max_tokens: int | None = None
    ) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.full((1, 4), float(inputs[0][0]), dtype=np.float32)

    def figures(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


def test_embedding_requests_take_turns_and_a_cancelled_one_is_dropped() -> None:
    here, there = multiprocessing.Pipe()
    core = EngineCore(OneAtATime(), there)  # type: ignore[arg-type]
    thread = threading.Thread(target=core.run, daemon=True)
    # sent together, before the loop starts: a big request, a small one, a cancelled one
    here.send([Embed(1, [[i] for i in range(50)]), Embed(2, [[7]]), Embed(3, [[1]] * 50)])
    here.send([Cancel(3)])
    thread.start()
    ended: list[Any] = []
    try:
        while len(ended) < 3:
            assert here.poll(30), ended
            ended += [m for m in here.recv() if isinstance(m, Embeddings | Done)]
    finally:
        here.send([Shutdown()])
        thread.join(10)
    order = [(type(m).__name__, m.id) for m in ended]
    # the cancel was read with the requests: the third is dropped before any batch of it
    assert order == [("Done", 3), ("Embeddings", 2), ("Embeddings", 1)], order
    assert isinstance(ended[0], Done) and ended[0].reason == "cancelled"
    assert core.embeds_cancelled == 1
    assert [float(row[0]) for row in ended[2].vectors] == [float(i) for i in range(50)]
