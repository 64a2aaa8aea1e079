"""One embeddings request's work: its budget, its cost, its charge, and its end when its
client leaves.

The engine's time is shared (:mod:`lmsp.engines.share`), but one request could still ask
for a great deal of it: :func:`budgeted` refuses a request whose inputs have more than
``LMSP_EMBED_REQUEST_TOKENS`` tokens in all (``400 embedding_budget_exceeded``, naming
the limit) before any work. What a request costs is known in one place,
:class:`EmbedWork` (the client, the model, its inputs and tokens): what the metrics
count and what the client is charged. :func:`admit` holds a request to its client's
token limits (``tokens_per_minute``, ``tokens_per_day``: ``429`` before any work) and
charges it in the same transaction, right before its engine is given the inputs: one
request in the usage ledger whose input tokens are every input's tokens, whether its
client then waits for the vectors or leaves. Checked and charged at once, concurrent
requests of one client cannot all pass a limit that only one of them would reach.

:func:`computed` waits for the engine's answer while watching the HTTP connection
(:func:`lmsp.api.leaving.unless_gone`): a client that goes away (a timeout, a crash,
``Ctrl-C``) cancels the request in the engine, which drops it between two batches and
says so (``Done(id, "cancelled")``): ``lmsp_embedding_abandoned`` counts the requests
whose client went away, ``lmsp_embedding_cancelled`` (:func:`engine_figures`) those the
engine confirmed it dropped, so abandoned work no longer delays anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from fastapi import Request
from prometheus_client.core import CounterMetricFamily, Metric

from lmsp import errors
from lmsp.api.leaving import unless_gone
from lmsp.engines.client import EmbedCall
from lmsp.engines.host import ModelHost
from lmsp.store import limits, usage
from lmsp.store.sql import Conn, clock_now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbedWork:
    """What one embeddings request costs: what its client is charged (fair share)."""

    client_id: str
    model: str
    inputs: int
    tokens: int  # every input's tokens: the engine's work


def budgeted(client_id: str, model: str, tokens: list[list[int]], limit: int) -> EmbedWork:
    """The request's work, or ``400 embedding_budget_exceeded`` past ``limit`` tokens."""
    work = EmbedWork(client_id, model, len(tokens), sum(len(t) for t in tokens))
    if work.tokens > limit:
        raise errors.LmspError(
            "embedding_budget_exceeded",
            f"The inputs have {work.tokens} tokens in all; one embeddings request may have at"
            f" most {limit} (the server's LMSP_EMBED_REQUEST_TOKENS). Send fewer inputs per"
            " request.",
            param="input",
        )
    return work


def admit(conn: Conn, work: EmbedWork) -> None:
    """In the writer's transaction: ``429 rate_limit_exceeded`` (writing nothing) if the
    client has used up its tokens of this minute or of this day (PROTOCOL.md 13), else
    count the request in its usage ledger: one request, its tokens as input."""
    limits.check_tokens(conn, work.client_id)
    usage.record(conn, work.client_id, work.model, clock_now(conn), prompt=work.tokens)


async def computed(call: EmbedCall, request: Request) -> npt.NDArray[np.float32]:
    """The vectors of ``call``; :class:`lmsp.api.leaving.ClientGone` (after cancelling it
    in the engine) when the HTTP client disconnects first."""
    waiting = asyncio.wrap_future(call.future)
    try:
        return await unless_gone(waiting, request)
    except BaseException:  # gone, or this task was cancelled (the server stopping)
        call.cancel()
        if not waiting.done():
            waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
        raise


def engine_figures(host: ModelHost) -> list[Metric]:
    """Embedding requests each loaded model's engine dropped on a cancel (since that
    engine started)."""
    family = CounterMetricFamily(
        "lmsp_embedding_cancelled",
        "Embedding requests an engine dropped because their client went away.",
        labels=["model"],
    )
    for model, count in host.embeds_cancelled().items():
        family.add_metric([model], count)
    return [family]
