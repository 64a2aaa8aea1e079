"""``POST /v1/embeddings``: vectors of texts, in OpenAI's shapes.

Everything is checked before any work: the shape of ``input``, the number of inputs
(``LMSP_EMBED_MAX_INPUTS``), the model, ``dimensions`` (only the model's own length),
each input's length in the model's tokens (``LMSP_EMBED_MAX_TOKENS``) and all of them
together (``LMSP_EMBED_REQUEST_TOKENS``, :mod:`lmsp.app.embedwork`); only then does the
model's engine compute them, in an embedding context of its own, taking turns with the
generating sequences (:mod:`lmsp.engines.share`). A client that disconnects meanwhile
cancels the work in the engine (:mod:`lmsp.api.leaving`).

An embeddings request is no task: only its usage is written. It is a pure function of
the model and the input (the same input always gives the same vectors), so a client
that lost an answer asks again and gets it; there is nothing to resume, cancel or
replay. For the same reason it takes no ``Idempotency-Key`` (refused like on any other
route that has no use for one). Its client's token limits hold it (``429`` before any
work) and its tokens are charged to its client's usage when the engine is given them
(:func:`lmsp.app.embedwork.admit`), even if the client leaves before the answer. It is
counted in ``/metrics`` too (``lmsp_embedding_inputs``, ``lmsp_embedding_tokens``, and
the HTTP figures).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lmsp import errors
from lmsp.api import leaving
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.schemas import EmbeddingCreate
from lmsp.app import embedwork
from lmsp.engines.base import EngineError, Tokenizer
from lmsp.protocol import embeddings
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1", tags=["embeddings"])

Writer = Annotated[Client, Depends(require("responses:write"))]


def _tokenized(
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


@router.post("/embeddings")
async def create_embeddings(body: EmbeddingCreate, request: Request, client: Writer) -> Response:
    """Embeddings of one or more texts (or token arrays), L2-normalised."""
    svc = service(request)
    settings = svc.settings
    inputs, names = embeddings.read_input(body.input, settings.embed_max_inputs)
    record = await svc.model(body.model, client)
    host = svc.host
    try:
        tokenizer = await asyncio.to_thread(host.tokenizer, record)
        if body.dimensions is not None and body.dimensions != tokenizer.n_embd:
            raise errors.LmspError(
                "unsupported_parameter",
                f"The model {body.model!r} gives embeddings of {tokenizer.n_embd} dimensions;"
                " lmsp does not shorten them: leave dimensions out or send"
                f" {tokenizer.n_embd}.",
                param="dimensions",
            )
        tokens = await asyncio.to_thread(
            _tokenized, tokenizer, inputs, names, settings.embed_max_tokens
        )
        work = embedwork.budgeted(client.id, record.id, tokens, settings.embed_request_tokens)
        engine, slot = await asyncio.to_thread(host.embedding_engine, record)
        try:
            # limited and charged at once, now that the engine takes the work
            await svc.db.write(lambda c: embedwork.admit(c, work))
            call = engine.embed_later(tokens)
            vectors = await embedwork.computed(call, request)
        finally:
            host.release(slot)
    except leaving.ClientGone:
        svc.metrics.embedding_abandoned(record.id)
        return Response(status_code=leaving.CLIENT_CLOSED)  # nobody reads it
    except EngineError as exc:
        param = "model" if _model_fault(exc) else None
        raise errors.LmspError(exc.code, exc.message, param=param) from exc
    counted = work.tokens
    svc.metrics.embedded(record.id, work.inputs, counted, yielded=call.yielded)
    fmt = body.encoding_format or "float"
    return JSONResponse(embeddings.answer(body.model, vectors, fmt, counted))


def _model_fault(exc: EngineError) -> bool:
    return exc.code in ("model_cannot_embed", "model_corrupt", "model_load_failed")
