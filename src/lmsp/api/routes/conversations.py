"""``/v1/conversations``: the OpenAI Conversations API (create, retrieve, update
metadata, delete; items list, add, retrieve, delete), on the durable store. A
conversation belongs to the client that made it: another client's id is ``404``; items
past its quotas are refused (``409 conversation_quota_exceeded``, nothing written)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.schemas import Body, InputItem, Metadata, unsupported
from lmsp.app.service import Service
from lmsp.protocol import items
from lmsp.store import conversations as store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]
Includes = Annotated[list[str], Query(max_length=16)]


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


async def _items(svc: Service, given: list[Any], param: str) -> list[dict[str, Any]]:
    """Items checked and normalized as a response's input is (files read as text once)."""
    if not given:
        return []
    normalized = await asyncio.to_thread(
        items.normalize, given, param=param, compaction_key=svc.compaction_key
    )
    await svc.files.read(normalized, lambda i: f"{param}.{i}")
    return normalized


@router.post("")
async def create_conversation(
    body: CreateConversation, request: Request, client: Writer
) -> dict[str, Any]:
    svc = service(request)
    added = await _items(svc, body.items or [], "items")
    row = await svc.db.write(
        lambda c: store.create(c, client.id, body.metadata or {}, added, svc.quota)
    )
    return store.render(row)


@router.get("/{conversation_id}")
async def retrieve_conversation(
    conversation_id: str, request: Request, client: Reader
) -> dict[str, Any]:
    svc = service(request)
    row = await svc.read(lambda: store.owned(svc.db.reader(), conversation_id, client))
    return store.render(row)


@router.post("/{conversation_id}")
async def update_conversation(
    conversation_id: str, body: UpdateConversation, request: Request, client: Writer
) -> dict[str, Any]:
    svc = service(request)
    row = await svc.db.write(
        lambda c: store.update(c, conversation_id, client, body.metadata or {})
    )
    return store.render(row)


@router.delete("/{conversation_id}")
async def delete_conversation(
    conversation_id: str, request: Request, client: Writer
) -> dict[str, Any]:
    svc = service(request)
    await svc.db.write(lambda c: store.delete(c, conversation_id, client))
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.get("/{conversation_id}/items")
async def list_items(
    conversation_id: str,
    request: Request,
    client: Reader,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
) -> dict[str, Any]:
    svc = service(request)
    _no_include(include)

    def read() -> dict[str, Any]:
        conn = svc.db.reader()
        store.owned(conn, conversation_id, client)
        return store.page(conn, conversation_id, order, after, limit)

    return await svc.read(read)


@router.post("/{conversation_id}/items")
async def add_items(
    conversation_id: str,
    body: AddItems,
    request: Request,
    client: Writer,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
) -> dict[str, Any]:
    svc = service(request)
    _no_include(include)
    await svc.read(lambda: store.owned(svc.db.reader(), conversation_id, client))
    added = await _items(svc, body.items, "items")

    def job(conn: Conn) -> list[dict[str, Any]]:
        store.owned(conn, conversation_id, client)  # (not deleted meanwhile)
        return store.append(conn, conversation_id, added, quota=svc.quota)

    stored = [store.shown(item) for item in await svc.db.write(job)]
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
    svc = service(request)
    _no_include(include)

    def read() -> dict[str, Any]:
        conn = svc.db.reader()
        store.owned(conn, conversation_id, client)
        return store.shown(store.item(conn, conversation_id, item_id))

    return await svc.read(read)


@router.delete("/{conversation_id}/items/{item_id}")
async def delete_item(
    conversation_id: str, item_id: str, request: Request, client: Writer
) -> dict[str, Any]:
    """Delete an item; answers the conversation (as OpenAI's API does)."""
    svc = service(request)

    def job(conn: Conn) -> dict[str, Any]:
        row = store.owned(conn, conversation_id, client)
        store.delete_item(conn, conversation_id, item_id)
        return store.render(row)

    return await svc.db.write(job)
