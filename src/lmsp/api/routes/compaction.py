"""``POST /v1/responses/compact`` (Open Responses) and ``POST /v1/responses/input_tokens``:
a history compacted into one ``compaction`` item, and the input tokens a create body
would cost, counted exactly as the create counts them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field, StringConstraints

from lmsp import errors
from lmsp.api import leaving
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.routes.responses import create_request
from lmsp.api.schemas import (
    MAX_INPUT_ITEMS,
    Body,
    CreateResponse,
    InputItem,
    ModelId,
    ServiceTier,
    ShortId,
    check_response,
    unsupported,
)
from lmsp.app import compaction, fitting, turns
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/responses", tags=["responses"])

Writer = Annotated[Client, Depends(require("responses:write"))]
Reader = Annotated[Client, Depends(require("responses:read"))]


class CompactBody(Body):
    """``POST /v1/responses/compact``."""

    model: ModelId
    input: (
        Annotated[str, StringConstraints(min_length=1)]
        | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
        | None
    ) = None
    instructions: str | None = None
    previous_response_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = (
        None
    )
    prompt_cache_key: ShortId | None = None
    safety_identifier: ShortId | None = None
    service_tier: ServiceTier | None = None
    # OpenAI features lmsp does not have: declared so that they are refused, not ignored
    image: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    conversation: Any = None


@router.post("/compact")
async def compact_response(body: CompactBody, request: Request, client: Writer) -> dict[str, Any]:
    """The history (``input``, after the history of ``previous_response_id``) with its
    older items replaced by one ``compaction`` item; the newest turn is kept as it is."""
    for name in ("image", "prompt_cache_options", "prompt_cache_retention", "conversation"):
        if getattr(body, name) is not None:
            raise unsupported(name, f"{name} is not supported by /v1/responses/compact here.")
    if body.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", "Only the default service tier exists here.")
    svc = service(request)
    compacted = compaction.compact(
        svc, client, body.model, body.input, body.instructions, body.previous_response_id
    )
    return await leaving.unless_gone(compacted, request)  # a client that leaves stops it


@router.post("/input_tokens")
async def count_input_tokens(
    body: CreateResponse, request: Request, client: Reader
) -> dict[str, Any]:
    """The prompt's tokens for this create body: instructions, tools, the history of
    ``previous_response_id`` or the items of ``conversation``, then the input, with
    the model's own tokenizer and chat template (after ``truncation: "auto"``, as a
    create would run it)."""
    read = check_response(body)
    if body.context_management is not None:
        raise unsupported(
            "context_management",
            "The count is of the input as sent: compaction would change it (count the"
            " output of POST /v1/responses/compact instead).",
        )
    turn = turns.read(body.conversation, None, body.previous_response_id)
    svc = service(request)
    given = create_request(body, read, turn, svc.settings.default_on_restart)
    prepared, record = await svc.prepare(client, given)
    size = await svc.read(svc.fit, record, prepared)
    if size is None:
        raise errors.LmspError(
            "model_load_failed",
            f"The tokenizer of {body.model!r} cannot be read now; retry, or see lmsp doctor.",
            param="model",
        )
    if not size.whole:  # a history of many contexts is not read whole for a count
        raise errors.LmspError(
            "context_length_exceeded",
            f"The prompt has at least {size.tokens} tokens, over {fitting.EXACT_BOUND} times"
            f" the context of {record.id!r} ({size.context}); lmsp counts no further."
            " Compact the history (POST /v1/responses/compact) or start a shorter one.",
            param="input",
        )
    return {"object": "response.input_tokens", "input_tokens": size[0]}
