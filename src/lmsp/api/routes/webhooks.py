"""``/v1/webhooks`` (PROTOCOL.md section 9): create (its secret shown once), list, get,
delete, and a webhook's recent deliveries.

A webhook is its client's: another client's id answers ``404``. ``admin`` oversees
every client's (the console lists them) and may create a webhook that hears every
client's responses (``all_clients``, an LMSP extension)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.app.service import Service
from lmsp.protocol import objects
from lmsp.protocol import webhooks as wire
from lmsp.store import audit
from lmsp.store import webhooks as store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]
EventName = Literal[
    "response.completed", "response.incomplete", "response.failed", "response.cancelled"
]


class NewWebhook(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    url: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_URL)]
    events: Annotated[list[EventName], Field(min_length=1, max_length=len(wire.EVENTS))]
    description: Annotated[str, StringConstraints(max_length=512)] | None = None
    all_clients: bool = False


def owned(conn: Conn, webhook_id: str, client: Client) -> Row:
    """The webhook if ``client`` may see it (its own; ``admin``: any), else ``404``."""
    row = store.get(conn, webhook_id)
    if row is None or not client.oversees(row["client_id"]):
        raise errors.not_found("webhook", webhook_id)
    return row


def refuse_unknown(body: BaseModel, what: str) -> None:
    """A field lmsp does not know is refused, never ignored."""
    for name in body.model_extra or {}:
        raise errors.LmspError(
            "unsupported_parameter", f"Unknown field {name!r} for {what}.", param=name
        )


def checked_url(svc: Service, url: str) -> str:
    """``url`` if ``LMSP_WEBHOOK_HOSTS`` lets a webhook name it, else ``400``."""
    try:
        return wire.check_url(url, wire.parse_hosts(svc.settings.webhook_hosts))
    except wire.InvalidUrl as exc:
        raise errors.LmspError("invalid_webhook_url", str(exc), param="url") from None


@router.post("", status_code=201)
async def create_webhook(body: NewWebhook, request: Request, client: Writer) -> JSONResponse:
    """A webhook for this client's responses; the answer carries its ``secret``
    (``whsec_…``), which no later answer shows."""
    refuse_unknown(body, "a webhook")
    svc = service(request)
    url = checked_url(svc, body.url)
    if body.all_clients and not client.admin:
        raise errors.forbidden("admin")
    events = [name for name in wire.EVENTS if name in set(body.events)]

    def job(conn: Conn) -> dict[str, Any]:
        row, secret = store.add(conn, client.id, url, events, body.description, body.all_clients)
        shown = store.render(row)
        change = {"url": url, "events": events, "all_clients": body.all_clients}
        audit.record(conn, client.id, "webhook.added", shown["id"], change)
        return dict(shown, secret=secret)

    return JSONResponse(await svc.db.write(job), 201)


@router.get("")
async def list_webhooks(request: Request, client: Reader) -> dict[str, Any]:
    """This client's webhooks; ``admin``: every client's (each names its ``client_id``)."""
    svc = service(request)
    rows = await svc.read(
        lambda: store.listed(svc.db.reader(), None if client.admin else client.id)
    )
    data = [store.render(row, with_client=client.admin) for row in rows]
    return {"object": "list", "data": data, "has_more": False}


@router.get("/{webhook_id}")
async def get_webhook(webhook_id: str, request: Request, client: Reader) -> dict[str, Any]:
    svc = service(request)
    row = await svc.read(lambda: owned(svc.db.reader(), webhook_id, client))
    return store.render(row, with_client=client.admin)


@router.delete("/{webhook_id}")
async def delete_webhook(webhook_id: str, request: Request, client: Writer) -> dict[str, Any]:
    """Remove a webhook: its pending deliveries are not sent."""
    await remove(service(request), webhook_id, client)
    return {"id": webhook_id, "object": "webhook.deleted", "deleted": True}


async def remove(svc: Service, webhook_id: str, client: Client) -> None:
    """Delete a webhook the client owns, audited (both faces of the API)."""

    def job(conn: Conn) -> None:
        owned(conn, webhook_id, client)
        store.delete(conn, webhook_id)
        audit.record(conn, client.id, "webhook.removed", webhook_id)

    await svc.db.write(job)


@router.get("/{webhook_id}/deliveries")
async def list_deliveries(
    webhook_id: str,
    request: Request,
    client: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, description="An event id.")] = None,
) -> dict[str, Any]:
    """The webhook's deliveries, newest first: event, status, tries, next try."""
    svc = service(request)
    return await svc.read(_deliveries_page, svc, webhook_id, client, limit, after)


def _deliveries_page(
    svc: Service, webhook_id: str, client: Client, limit: int, after: str | None
) -> dict[str, Any]:
    conn = svc.db.reader()
    owned(conn, webhook_id, client)
    before: int | None = None
    if after is not None:
        before = store.delivery_seq(conn, webhook_id, after)
        if before is None:
            raise errors.invalid(f"Unknown cursor {after!r}.", param="after")
    rows = store.deliveries(conn, webhook_id, before, limit + 1)
    data = [store.render_delivery(row, detailed=client.admin) for row in rows[:limit]]
    return objects.list_page(data, len(rows) > limit)
