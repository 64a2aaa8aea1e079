"""``POST /v1/embeddings``: vectors of texts, in OpenAI's shapes (:mod:`lmsp.app.embeddings`:
every check before any work, the client's token limits, the charge, the engine's turn).

A client that disconnects meanwhile cancels the work in the engine
(:mod:`lmsp.api.leaving`).

An embeddings request is no task: only its usage is written. It is a pure function of
the model and the input (the same input always gives the same vectors), so a client
that lost an answer asks again and gets it; there is nothing to resume, cancel or
replay. For the same reason it takes no ``Idempotency-Key`` (refused like on any other
route that has no use for one). Its client's token limits hold it (``429`` before any
work) and its tokens are charged to its client's usage when the engine is given them
(:func:`lmsp.app.embeddings.admit`), even if the client leaves before the answer. It is
counted in ``/metrics`` too (``lmsp_embedding_inputs``, ``lmsp_embedding_tokens``, and
the HTTP figures).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lmsp.api import leaving
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.schemas import EmbeddingCreate
from lmsp.app import embeddings
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1", tags=["embeddings"])

Writer = Annotated[Client, Depends(require("responses:write"))]


@router.post("/embeddings")
async def create_embeddings(body: EmbeddingCreate, request: Request, client: Writer) -> Response:
    """Embeddings of one or more texts (or token arrays), L2-normalised."""
    asked = embeddings.Embed(
        body.model, body.input, body.dimensions, body.encoding_format or "float"
    )
    answer = await embeddings.embed(service(request), client, asked, leaving.watch(request))
    return JSONResponse(answer)
