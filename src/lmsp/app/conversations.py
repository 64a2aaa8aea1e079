"""Conversations (the OpenAI Conversations API, on the durable store): create, show,
change the metadata of and delete one; list, add, show and delete its items. A
conversation belongs to the client that made it: another client's id is ``404``; items
past its quotas are refused (``409 conversation_quota_exceeded``, nothing written)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from lmsp.app.core import Core
from lmsp.protocol import items
from lmsp.store import conversations as store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

Item = dict[str, Any]


async def _items(core: Core, given: list[Any], param: str) -> list[Item]:
    """Items checked and normalized as a response's input is (files read as text once)."""
    if not given:
        return []
    normalized = await asyncio.to_thread(
        items.normalize, given, param=param, compaction_key=core.compaction_key
    )
    await core.files.read(normalized, lambda i: f"{param}.{i}")
    return normalized


async def create(
    core: Core, client: Client, given: list[Any], metadata: dict[str, str]
) -> dict[str, Any]:
    """A new conversation of ``client`` holding the items ``given``."""
    added = await _items(core, given, "items")
    row = await core.db.write(lambda c: store.create(c, client.id, metadata, added, core.quota))
    return store.render(row)


async def show(core: Core, conversation_id: str, client: Client) -> dict[str, Any]:
    row = await core.read(lambda: store.owned(core.db.reader(), conversation_id, client))
    return store.render(row)


async def update(
    core: Core, conversation_id: str, client: Client, metadata: dict[str, str]
) -> dict[str, Any]:
    """Replace the conversation's metadata."""
    row = await core.db.write(lambda c: store.update(c, conversation_id, client, metadata))
    return store.render(row)


async def delete(core: Core, conversation_id: str, client: Client) -> None:
    await core.db.write(lambda c: store.delete(c, conversation_id, client))


async def page(
    core: Core,
    conversation_id: str,
    client: Client,
    order: Literal["asc", "desc"],
    after: str | None,
    limit: int,
) -> dict[str, Any]:
    """A page of the conversation's items."""

    def read() -> dict[str, Any]:
        conn = core.db.reader()
        store.owned(conn, conversation_id, client)
        return store.page(conn, conversation_id, order, after, limit)

    return await core.read(read)


async def add(core: Core, conversation_id: str, client: Client, given: list[Any]) -> list[Item]:
    """Append the items ``given`` (checked, their files read) within its quotas: the
    items as stored and shown."""
    await core.read(lambda: store.owned(core.db.reader(), conversation_id, client))
    added = await _items(core, given, "items")

    def job(conn: Conn) -> list[Item]:
        store.owned(conn, conversation_id, client)  # (not deleted meanwhile)
        return store.append(conn, conversation_id, added, quota=core.quota)

    return [store.shown(item) for item in await core.db.write(job)]


async def item(core: Core, conversation_id: str, item_id: str, client: Client) -> Item:
    def read() -> Item:
        conn = core.db.reader()
        store.owned(conn, conversation_id, client)
        return store.shown(store.item(conn, conversation_id, item_id))

    return await core.read(read)


async def delete_item(
    core: Core, conversation_id: str, item_id: str, client: Client
) -> dict[str, Any]:
    """Delete an item; the conversation (as OpenAI's API answers it)."""

    def job(conn: Conn) -> Row:
        row = store.owned(conn, conversation_id, client)
        store.delete_item(conn, conversation_id, item_id)
        return row

    return store.render(await core.db.write(job))
