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
every client's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.routes.deps import service
from lmsp.api.routes.webhooks import Reader, Writer, checked_url, owned, refuse_unknown, remove
from lmsp.outbound import deliverer as sender
from lmsp.protocol import objects
from lmsp.protocol import webhooks as wire
from lmsp.store import audit
from lmsp.store import webhooks as store
from lmsp.store.sql import Conn, Row

log = logging.getLogger(__name__)

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


def _events(names: list[str]) -> list[str]:
    """The event types, in lmsp's order, if lmsp sends each; else ``400``."""
    for name in names:
        if name not in wire.EVENTS:
            raise errors.invalid(
                f"lmsp does not send {name!r} events; it sends {', '.join(wire.EVENTS)}.",
                param="event_types",
                code="invalid_value",
            )
    return [name for name in wire.EVENTS if name in set(names)]


def _event_type(name: str) -> str:
    if name not in wire.EVENTS:
        raise errors.invalid(
            f"lmsp does not send {name!r} events; it sends {', '.join(wire.EVENTS)}.",
            param="event_type",
            code="invalid_value",
        )
    return name


@router.post("", status_code=201)
async def create_endpoint(body: NewEndpoint, request: Request, client: Writer) -> JSONResponse:
    """A webhook for this client's responses; the answer carries its ``signing_secret``
    (``whsec_…``), which only a rotation shows again (a new one)."""
    refuse_unknown(body, "a webhook endpoint")
    svc = service(request)
    url = checked_url(svc, body.url)
    events = _events(body.event_types)

    def job(conn: Conn) -> dict[str, Any]:
        row, secret = store.add(conn, client.id, url, events, body.name, False)
        change = {"url": url, "events": events, "all_clients": False}
        audit.record(conn, client.id, "webhook.added", row["id"], change)
        return render(row, secret=secret)

    return JSONResponse(await svc.db.write(job), 201)


@router.get("")
async def list_endpoints(
    request: Request,
    client: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, description="A webhook id.")] = None,
) -> dict[str, Any]:
    """This client's webhooks, newest first (``admin``: every client's, each naming its
    ``client_id``)."""
    svc = service(request)

    def page() -> dict[str, Any]:
        conn = svc.db.reader()
        cursor: Row | None = None
        if after is not None:
            cursor = store.get(conn, after)
            if cursor is None or not client.oversees(cursor["client_id"]):
                raise errors.invalid(f"Unknown cursor {after!r}.", param="after")
        whose = None if client.admin else client.id
        rows = store.newest_first(conn, whose, cursor, limit + 1)
        data = [render(row, with_client=client.admin) for row in rows[:limit]]
        return objects.list_page(data, len(rows) > limit)

    return await svc.read(page)


@router.get("/{webhook_endpoint_id}")
async def get_endpoint(
    webhook_endpoint_id: str, request: Request, client: Reader
) -> dict[str, Any]:
    svc = service(request)
    row = await svc.read(lambda: owned(svc.db.reader(), webhook_endpoint_id, client))
    return render(row, with_client=client.admin)


@router.post("/{webhook_endpoint_id}")
async def update_endpoint(
    webhook_endpoint_id: str, body: EndpointChange, request: Request, client: Writer
) -> dict[str, Any]:
    """Change the name, URL or event types (what is not given stays). Pending
    deliveries go to the new URL; ``updated_at`` moves only if something changed."""
    refuse_unknown(body, "a webhook endpoint")
    svc = service(request)
    url = None if body.url is None else checked_url(svc, body.url)
    events = None if body.event_types is None else _events(body.event_types)

    def job(conn: Conn) -> dict[str, Any]:
        owned(conn, webhook_endpoint_id, client)
        changed = store.update(
            conn, webhook_endpoint_id, url=url, events=events, description=body.name
        )
        if changed is None:
            raise errors.not_found("webhook", webhook_endpoint_id)
        row, change = changed
        if change:
            audit.record(conn, client.id, "webhook.updated", webhook_endpoint_id, change)
        return render(row, with_client=client.admin)

    return await svc.db.write(job)


@router.delete("/{webhook_endpoint_id}")
async def delete_endpoint(
    webhook_endpoint_id: str, request: Request, client: Writer
) -> dict[str, Any]:
    """Remove a webhook: its pending deliveries are not sent."""
    await remove(service(request), webhook_endpoint_id, client)
    return {"id": webhook_endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True}


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
    svc = service(request)

    def job(conn: Conn) -> dict[str, Any]:
        owned(conn, webhook_endpoint_id, client)
        rotated = store.rotate(conn, webhook_endpoint_id)
        if rotated is None:
            raise errors.not_found("webhook", webhook_endpoint_id)
        row, secret = rotated
        audit.record(conn, client.id, "webhook.secret_rotated", webhook_endpoint_id)
        return render(row, secret=secret, with_client=client.admin)

    return await svc.db.write(job)


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
    event_type = _event_type(body.event_type)
    svc = service(request)
    row = await svc.read(lambda: owned(svc.db.reader(), webhook_endpoint_id, client))
    url = checked_url(svc, row["url"])  # the hosts allowed now, as for a delivery
    _test_due(svc.webhook_tests, webhook_endpoint_id)
    began = time.monotonic()
    hosts = wire.parse_hosts(svc.settings.webhook_hosts)
    try:
        status = await sender.send_test(url, row["secret"], event_type, hosts)
        failure = None if 200 <= status < 300 else f"it answered {status}"
    except sender.NoAnswer as exc:
        failure = str(exc)
    if failure is not None:
        log.info("webhook %s: the test event was not accepted: %s", webhook_endpoint_id, failure)
        if not client.admin:  # the same answer at the same time, closed port or open
            await asyncio.sleep(sender.TEST_TIMEOUT - (time.monotonic() - began))
        raise errors.LmspError(
            "webhook_unreachable",
            "The webhook's URL did not accept the test event (no 2xx answer within"
            f" {sender.TEST_TIMEOUT:.0f} s){f': {failure}' if client.admin else ''}.",
            param="url",
        )
    return {
        "object": "webhook_endpoint.test",
        "webhook_endpoint_id": webhook_endpoint_id,
        "event_type": event_type,
        "status_code": status,
        "success": True,
    }


#: the least time between two tests of one webhook: a client cannot make the service
#: send a stream of requests to a URL (each test is one request, answered or not in 5 s)
TEST_INTERVAL = 1.0


def _test_due(sent: dict[str, float], endpoint_id: str) -> None:
    """Note a test of ``endpoint_id`` now, or ``429 rate_limit_exceeded`` (with
    ``Retry-After``) if its last one was less than :data:`TEST_INTERVAL` ago."""
    now = time.monotonic()
    last = sent.get(endpoint_id)
    if last is not None and now - last < TEST_INTERVAL:
        raise errors.LmspError(
            "rate_limit_exceeded",
            f"A webhook is tested at most once every {TEST_INTERVAL:.0f} s; try again shortly.",
            headers={"Retry-After": str(math.ceil(TEST_INTERVAL - (now - last)))},
        )
    if len(sent) > 1000:  # forget the webhooks not tested lately
        for old in [k for k, t in sent.items() if now - t >= TEST_INTERVAL]:
            del sent[old]
    sent[endpoint_id] = now


@types_router.get("")
async def list_event_types(client: Reader) -> dict[str, Any]:
    """The event types a webhook may ask for."""
    return {"object": "list", "data": list(wire.EVENTS)}
