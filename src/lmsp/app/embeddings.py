"""Embeddings: vectors of texts (or token arrays), in OpenAI's shapes.

Everything is checked before any work: the shape of the input, the number of inputs
(``LMSP_EMBED_MAX_INPUTS``), the model, ``dimensions`` (only the model's own length),
each input's length in the model's tokens (``LMSP_EMBED_MAX_TOKENS``) and all of them
together (``LMSP_EMBED_REQUEST_TOKENS``: :func:`budgeted` refuses a request past it with
``400 embedding_budget_exceeded``); only then does the model's engine compute them, in
an embedding context of its own, taking turns with the generating sequences
(:mod:`lmsp.engines.share`).

What a request costs is known in one place, :class:`EmbedWork` (the client, the model,
its inputs and tokens): what the metrics count and what the client is charged.
:func:`admit` holds a request to its client's token limits (``tokens_per_minute``,
``tokens_per_day``: ``429`` before any work) and charges it in the same transaction,
right before its engine is given the inputs: one request in the usage ledger whose input
tokens are every input's tokens, whether its client then waits for the vectors or
leaves. Checked and charged at once, concurrent requests of one client cannot all pass a
limit that only one of them would reach.

A client that goes away meanwhile (a timeout, a crash, ``Ctrl-C``: the transport's
:class:`lmsp.app.watch.Watch` says so) cancels the request in the engine, which drops it
between two batches and says so (``Done(id, "cancelled")``):
``lmsp_embedding_abandoned`` counts the requests whose client went away,
``lmsp_embedding_cancelled`` (:func:`lmsp.app.figures.embedding_figures`) those the
engine confirmed it dropped, so abandoned work no longer delays anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmsp import errors
from lmsp.app import models
from lmsp.app.core import Core
from lmsp.app.watch import ClientGone, Watch
from lmsp.engines.base import EngineError, Tokenizer
from lmsp.engines.client import EmbedCall
from lmsp.protocol import embeddings
from lmsp.store import limits, usage
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, clock_now

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class Embed:
    """One embeddings request: ``input`` as given (read by
    :func:`lmsp.protocol.embeddings.read_input`), the model's name, the vectors' length
    the client expects (``None``: the model's own) and their encoding."""

    model: str
    input: Any
    dimensions: int | None = None
    encoding_format: str = "float"


@dataclass(frozen=True)
class EmbedWork:
    """What one embeddings request costs: what its client is charged (fair share)."""

    client_id: str
    model: str
    inputs: int
    tokens: int  # every input's tokens: the engine's work


async def embed(core: Core, client: Client, asked: Embed, watch: Watch) -> dict[str, Any]:
    """The answer (``object: list`` of L2-normalised vectors, and the usage);
    :class:`lmsp.app.watch.ClientGone` when the client left before it."""
    settings = core.settings
    inputs, names = embeddings.read_input(asked.input, settings.embed_max_inputs)
    record = await models.resolve(core, asked.model, client)
    host = core.host
    try:
        tokenizer = await asyncio.to_thread(host.tokenizer, record)
        _check_dimensions(asked, tokenizer)
        tokens = await asyncio.to_thread(
            tokenized, tokenizer, inputs, names, settings.embed_max_tokens
        )
        work = budgeted(client.id, record.id, tokens, settings.embed_request_tokens)
        engine, slot = await asyncio.to_thread(host.embedding_engine, record)
        try:
            # limited and charged at once, now that the engine takes the work
            await core.db.write(lambda c: admit(c, work))
            call = engine.embed_later(tokens)
            vectors = await computed(call, watch)
        finally:
            host.release(slot)
    except ClientGone:
        core.metrics.embedding_abandoned(record.id)
        raise
    except EngineError as exc:
        param = "model" if _model_fault(exc) else None
        raise errors.LmspError(exc.code, exc.message, param=param) from exc
    core.metrics.embedded(record.id, work.inputs, work.tokens, yielded=call.yielded)
    return embeddings.answer(asked.model, vectors, asked.encoding_format, work.tokens)


def _check_dimensions(asked: Embed, tokenizer: Tokenizer) -> None:
    if asked.dimensions is not None and asked.dimensions != tokenizer.n_embd:
        raise errors.LmspError(
            "unsupported_parameter",
            f"The model {asked.model!r} gives embeddings of {tokenizer.n_embd} dimensions;"
            " lmsp does not shorten them: leave dimensions out or send"
            f" {tokenizer.n_embd}.",
            param="dimensions",
        )


def _model_fault(exc: EngineError) -> bool:
    return exc.code in ("model_cannot_embed", "model_corrupt", "model_load_failed")


def tokenized(
    tokenizer: Tokenizer, inputs: list[embeddings.Input], names: list[str], max_tokens: int
) -> list[list[int]]:
    """Each input as the model's tokens (token arrays checked against its vocabulary);
    a ``400`` naming the first one longer than ``max_tokens``."""
    out: list[list[int]] = []
    for given, where in zip(inputs, names, strict=True):
        if isinstance(given, str):
            tokens = tokenizer.text_tokens(given)
        else:
            tokens = given
            for j, token in enumerate(tokens):
                if token >= tokenizer.n_vocab:
                    raise errors.LmspError(
                        "invalid_value",
                        f"Token id {token} is not in the model's vocabulary "
                        f"(0 to {tokenizer.n_vocab - 1}).",
                        param=f"{where}.{j}",
                    )
        if not tokens:
            raise errors.LmspError("invalid_value", "This input has no tokens.", param=where)
        if len(tokens) > max_tokens:
            raise errors.LmspError(
                "context_length_exceeded",
                f"This input has {len(tokens)} tokens; an input may have at most {max_tokens}"
                " (the server's LMSP_EMBED_MAX_TOKENS). Split it.",
                param=where,
            )
        out.append(tokens)
    return out


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


async def computed(call: EmbedCall, watch: Watch) -> npt.NDArray[np.float32]:
    """The vectors of ``call``; :class:`lmsp.app.watch.ClientGone` (after cancelling it
    in the engine) when the client disconnects first."""
    waiting = asyncio.wrap_future(call.future)
    try:
        return await watch(waiting)
    except BaseException:  # gone, or this task was cancelled (the server stopping)
        call.cancel()
        if not waiting.done():
            waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
        raise
