"""``/v1/webhook_endpoints``: the webhooks of ``/v1/webhooks`` (PROTOCOL.md section 9) in
OpenAI's shapes, so the unchanged ``openai`` SDK manages them (``client.webhooks.create``,
``retrieve``, ``update``, ``list``, ``delete``, ``rotate_secret``, ``test``, and
``client.webhooks.event_types.list`` at ``/v1/webhook_event_types``).

One store, one id space, one sender: a webhook made on either face is seen on both.
``name`` is the webhook's ``description``, ``event_types`` its ``events``,
``signing_secret`` its ``secret`` (in the answers of create and rotate only; every
object carries ``signing_secret_hint``, ``whsec_…`` and the secret's last four
characters). What lmsp cannot honour is refused, never ignored: an event type it does
not send, an unknown field, a URL outside ``LMSP_WEBHOOK_HOSTS``, keeping an old secret
alive after a rotation. Scopes and ownership are ``/v1/webhooks``': ``responses:read``
to read, ``responses:write`` to change, another client's id ``404``; ``admin`` sees
every client's (:mod:`lmsp.app.webhooks`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.routes.deps import delete_route, service
from lmsp.api.routes.webhooks import Reader, Writer, refuse_unknown
from lmsp.app import webhooks
from lmsp.protocol import objects
from lmsp.protocol import webhooks as wire
from lmsp.store import webhooks as store
from lmsp.store.sql import Row

router = APIRouter(prefix="/v1/webhook_endpoints", tags=["webhooks"])
types_router = APIRouter(prefix="/v1/webhook_event_types", tags=["webhooks"])

Name = Annotated[str, StringConstraints(max_length=512)]
Url = Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_URL)]
EventTypes = Annotated[
    list[Annotated[str, StringConstraints(max_length=128)]], Field(min_length=1, max_length=64)
]


class NewEndpoint(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    name: Name
    url: Url
    event_types: EventTypes


class EndpointChange(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    name: Name | None = None
    url: Url | None = None
    event_types: EventTypes | None = None


class Rotation(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    keep_old_secret_active_for_24_hours: bool = False


class Probe(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    event_type: Annotated[str, StringConstraints(max_length=128)]


def hint(secret: str) -> str:
    """A masked hint of a secret: enough to tell two apart, nothing to sign with."""
    return f"{store.SECRET_PREFIX}…{secret[-4:]}"


def render(row: Row, *, secret: str | None = None, with_client: bool = False) -> dict[str, Any]:
    """A webhook as OpenAI's ``webhook_endpoint`` (``signing_secret``: only when given,
    on create and rotate)."""
    obj: dict[str, Any] = {
        "id": row["id"],
        "object": "webhook_endpoint",
        "created_at": int(row["created_at"]),
        "updated_at": int(row["updated_at"] or row["created_at"]),
        "name": row["description"] or "",
        "url": row["url"],
        "event_types": json.loads(row["events"]),
        "signing_secret_hint": hint(secret or row["secret"]),
    }
    if secret is not None:
        obj["signing_secret"] = secret
    if with_client:
        obj["client_id"] = row["client_id"]
    return obj


@router.post("", status_code=201)
async def create_endpoint(body: NewEndpoint, request: Request, client: Writer) -> JSONResponse:
    """A webhook for this client's responses; the answer carries its ``signing_secret``
    (``whsec_…``), which only a rotation shows again (a new one)."""
    refuse_unknown(body, "a webhook endpoint")
    new = webhooks.NewWebhook(body.url, body.event_types, body.name)
    row, secret = await webhooks.create(service(request), client, new)
    return JSONResponse(render(row, secret=secret), 201)


@router.get("")
async def list_endpoints(
    request: Request,
    client: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, description="A webhook id.")] = None,
) -> dict[str, Any]:
    """This client's webhooks, newest first (``admin``: every client's, each naming its
    ``client_id``)."""
    rows, more = await webhooks.newest_first(service(request), client, limit, after)
    return objects.list_page([render(row, with_client=client.admin) for row in rows], more)


@router.get("/{webhook_endpoint_id}")
async def get_endpoint(
    webhook_endpoint_id: str, request: Request, client: Reader
) -> dict[str, Any]:
    row = await webhooks.show(service(request), webhook_endpoint_id, client)
    return render(row, with_client=client.admin)


@router.post("/{webhook_endpoint_id}")
async def update_endpoint(
    webhook_endpoint_id: str, body: EndpointChange, request: Request, client: Writer
) -> dict[str, Any]:
    """Change the name, URL or event types (what is not given stays). Pending
    deliveries go to the new URL; ``updated_at`` moves only if something changed."""
    refuse_unknown(body, "a webhook endpoint")
    row = await webhooks.update(
        service(request),
        client,
        webhook_endpoint_id,
        url=body.url,
        events=body.event_types,
        description=body.name,
    )
    return render(row, with_client=client.admin)


delete_route(
    router,
    "delete_endpoint",
    "webhook_endpoint_id",
    webhooks.remove,
    "webhook_endpoint.deleted",
    "Remove a webhook: its pending deliveries are not sent.",
)


@router.post("/{webhook_endpoint_id}/rotate_secret")
async def rotate_secret(
    webhook_endpoint_id: str,
    request: Request,
    client: Writer,
    body: Rotation | None = None,
) -> dict[str, Any]:
    """A new signing secret, shown in this answer only; the old one signs nothing from
    now on (``keep_old_secret_active_for_24_hours`` is refused: lmsp signs with one
    secret)."""
    if body is not None:
        refuse_unknown(body, "a rotation")
        if body.keep_old_secret_active_for_24_hours:
            raise errors.invalid(
                "lmsp signs with one secret: the old one cannot stay active after a rotation.",
                param="keep_old_secret_active_for_24_hours",
                code="invalid_value",
            )
    row, secret = await webhooks.rotate(service(request), client, webhook_endpoint_id)
    return render(row, secret=secret, with_client=client.admin)


@router.post("/{webhook_endpoint_id}/test")
async def test_endpoint(
    webhook_endpoint_id: str, body: Probe, request: Request, client: Writer
) -> dict[str, Any]:
    """Send one signed test event to the webhook's URL now and say whether it was
    accepted (a 2xx within 5 s: its status is reported). Not a delivery: not in the
    outbox, not retried, not in the deliveries list. Anything else is ``400
    webhook_unreachable``, which tells an ``admin`` client what happened (the status, or
    the connection's error) and any other client nothing more, 5 s after the test began
    whatever happened: the test is no probe of which ports of this machine are open."""
    refuse_unknown(body, "a webhook test")
    core = service(request)
    status = await webhooks.test(core, client, webhook_endpoint_id, body.event_type)
    return {
        "object": "webhook_endpoint.test",
        "webhook_endpoint_id": webhook_endpoint_id,
        "event_type": body.event_type,
        "status_code": status,
        "success": True,
    }


@types_router.get("")
async def list_event_types(client: Reader) -> dict[str, Any]:
    """The event types a webhook may ask for."""
    return {"object": "list", "data": list(wire.EVENTS)}
