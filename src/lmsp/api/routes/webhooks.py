"""``/v1/webhooks`` (PROTOCOL.md section 9): create (its secret shown once), list, get,
delete, and a webhook's recent deliveries (:mod:`lmsp.app.webhooks`).

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
from lmsp.api.routes.deps import delete_route, service
from lmsp.app import webhooks
from lmsp.protocol import webhooks as wire
from lmsp.store import webhooks as store
from lmsp.store.clients import Client

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


def refuse_unknown(body: BaseModel, what: str) -> None:
    """A field lmsp does not know is refused, never ignored."""
    for name in body.model_extra or {}:
        raise errors.LmspError(
            "unsupported_parameter", f"Unknown field {name!r} for {what}.", param=name
        )


@router.post("", status_code=201)
async def create_webhook(body: NewWebhook, request: Request, client: Writer) -> JSONResponse:
    """A webhook for this client's responses; the answer carries its ``secret``
    (``whsec_…``), which no later answer shows."""
    refuse_unknown(body, "a webhook")
    new = webhooks.NewWebhook(body.url, list(body.events), body.description, body.all_clients)
    row, secret = await webhooks.create(service(request), client, new)
    return JSONResponse(dict(store.render(row), secret=secret), 201)


@router.get("")
async def list_webhooks(request: Request, client: Reader) -> dict[str, Any]:
    """This client's webhooks; ``admin``: every client's (each names its ``client_id``)."""
    rows = await webhooks.listing(service(request), client)
    data = [store.render(row, with_client=client.admin) for row in rows]
    return {"object": "list", "data": data, "has_more": False}


@router.get("/{webhook_id}")
async def get_webhook(webhook_id: str, request: Request, client: Reader) -> dict[str, Any]:
    row = await webhooks.show(service(request), webhook_id, client)
    return store.render(row, with_client=client.admin)


delete_route(
    router,
    "delete_webhook",
    "webhook_id",
    webhooks.remove,
    "webhook.deleted",
    "Remove a webhook: its pending deliveries are not sent.",
)


@router.get("/{webhook_id}/deliveries")
async def list_deliveries(
    webhook_id: str,
    request: Request,
    client: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, description="An event id.")] = None,
) -> dict[str, Any]:
    """The webhook's deliveries, newest first: event, status, tries, next try."""
    return await webhooks.deliveries(service(request), webhook_id, client, limit, after)
