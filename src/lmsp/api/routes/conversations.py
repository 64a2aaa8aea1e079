"""``/v1/conversations``: the OpenAI Conversations API (create, retrieve, update
metadata, delete; items list, add, retrieve, delete), on the durable store
(:mod:`lmsp.app.conversations`). A conversation belongs to the client that made it:
another client's id is ``404``; items past its quotas are refused (``409
conversation_quota_exceeded``, nothing written)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from lmsp.api.auth import require
from lmsp.api.params import Includes, ItemsQuery
from lmsp.api.routes.deps import delete_route, service
from lmsp.api.schemas import Body, InputItem, Metadata, unsupported
from lmsp.app import conversations
from lmsp.store import conversations as store
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]


class CreateConversation(Body):
    items: Annotated[list[InputItem], Field(max_length=store.MAX_ADD)] | None = None
    metadata: Metadata | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None


class UpdateConversation(Body):
    metadata: Metadata | None


class AddItems(Body):
    items: Annotated[list[InputItem], Field(min_length=1, max_length=store.MAX_ADD)]


def _no_include(include: list[str]) -> None:
    """Items are stored as given: nothing more to include (``400``, never ignored)."""
    for value in include:
        if value != "message.input_image.image_url":  # no images are ever stored
            raise unsupported("include", f"include {value!r} does not apply to these items.")


@router.post("")
async def create_conversation(
    body: CreateConversation, request: Request, client: Writer
) -> dict[str, Any]:
    return await conversations.create(
        service(request), client, body.items or [], body.metadata or {}
    )


@router.get("/{conversation_id}")
async def retrieve_conversation(
    conversation_id: str, request: Request, client: Reader
) -> dict[str, Any]:
    return await conversations.show(service(request), conversation_id, client)


@router.post("/{conversation_id}")
async def update_conversation(
    conversation_id: str, body: UpdateConversation, request: Request, client: Writer
) -> dict[str, Any]:
    return await conversations.update(
        service(request), conversation_id, client, body.metadata or {}
    )


delete_route(
    router, "delete_conversation", "conversation_id", conversations.delete, "conversation.deleted"
)


@router.get("/{conversation_id}/items")
async def list_items(
    conversation_id: str, request: Request, client: Reader, page: ItemsQuery
) -> dict[str, Any]:
    _no_include(page.include)
    core = service(request)
    return await conversations.page(
        core, conversation_id, client, page.order, page.after, page.limit
    )


@router.post("/{conversation_id}/items")
async def add_items(
    conversation_id: str,
    body: AddItems,
    request: Request,
    client: Writer,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
) -> dict[str, Any]:
    _no_include(include)
    stored = await conversations.add(service(request), conversation_id, client, body.items)
    return {
        "object": "list",
        "data": stored,
        "first_id": stored[0]["id"],
        "last_id": stored[-1]["id"],
        "has_more": False,
    }


@router.get("/{conversation_id}/items/{item_id}")
async def retrieve_item(
    conversation_id: str,
    item_id: str,
    request: Request,
    client: Reader,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
) -> dict[str, Any]:
    _no_include(include)
    return await conversations.item(service(request), conversation_id, item_id, client)


@router.delete("/{conversation_id}/items/{item_id}")
async def delete_item(
    conversation_id: str, item_id: str, request: Request, client: Writer
) -> dict[str, Any]:
    """Delete an item; answers the conversation (as OpenAI's API does)."""
    return await conversations.delete_item(service(request), conversation_id, item_id, client)
