"""Webhooks (PROTOCOL.md section 9): create one (its secret shown once), list, show,
change, delete it, rotate its secret, send it a test event, and list its recent
deliveries. One store, one id space, one sender, whichever face of the API (``/v1/webhooks``
or OpenAI's ``/v1/webhook_endpoints``) made it.

A webhook is its client's: another client's id is ``404``. ``admin`` oversees every
client's (the console lists them) and may create a webhook that hears every client's
responses (``all_clients``, an LMSP extension). What lmsp cannot honour is refused,
never ignored: an event type it does not send, a URL outside ``LMSP_WEBHOOK_HOSTS``.
Every change is audited."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from lmsp import errors
from lmsp.app.core import Core
from lmsp.outbound import deliverer as sender
from lmsp.protocol import objects
from lmsp.protocol import webhooks as wire
from lmsp.store import audit
from lmsp.store import webhooks as store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

log = logging.getLogger(__name__)

#: the least time between two tests of one webhook: a client cannot make the service
#: send a stream of requests to a URL (each test is one request, answered or not in 5 s)
TEST_INTERVAL = 1.0


def owned(conn: Conn, webhook_id: str, client: Client) -> Row:
    """The webhook if ``client`` may see it (its own; ``admin``: any), else ``404``."""
    row = store.get(conn, webhook_id)
    if row is None or not client.oversees(row["client_id"]):
        raise errors.not_found("webhook", webhook_id)
    return row


def checked_url(core: Core, url: str) -> str:
    """``url`` if ``LMSP_WEBHOOK_HOSTS`` lets a webhook name it, else ``400``."""
    try:
        return wire.check_url(url, wire.parse_hosts(core.settings.webhook_hosts))
    except wire.InvalidUrl as exc:
        raise errors.LmspError("invalid_webhook_url", str(exc), param="url") from None


def known_events(names: list[str], param: str = "event_types") -> list[str]:
    """The event types, in lmsp's order, if lmsp sends each; else ``400``."""
    for name in names:
        if name not in wire.EVENTS:
            raise errors.invalid(
                f"lmsp does not send {name!r} events; it sends {', '.join(wire.EVENTS)}.",
                param=param,
                code="invalid_value",
            )
    return [name for name in wire.EVENTS if name in set(names)]


@dataclass(frozen=True)
class NewWebhook:
    url: str
    events: list[str]
    description: str | None = None
    all_clients: bool = False


async def create(core: Core, client: Client, new: NewWebhook) -> tuple[Row, str]:
    """A webhook for ``client``'s responses (``all_clients``: every client's, for an
    ``admin``): its row and its secret (``whsec_…``), which nothing shows again."""
    url = checked_url(core, new.url)
    if new.all_clients and not client.admin:
        raise errors.forbidden("admin")
    events = known_events(new.events)

    def job(conn: Conn) -> tuple[Row, str]:
        row, secret = store.add(conn, client.id, url, events, new.description, new.all_clients)
        change = {"url": url, "events": events, "all_clients": new.all_clients}
        audit.record(conn, client.id, "webhook.added", row["id"], change)
        return row, secret

    return await core.db.write(job)


async def listing(core: Core, client: Client) -> list[Row]:
    """This client's webhooks, oldest first; ``admin``: every client's."""
    return await core.read(
        lambda: store.listed(core.db.reader(), None if client.admin else client.id)
    )


async def newest_first(
    core: Core, client: Client, limit: int, after: str | None
) -> tuple[list[Row], bool]:
    """A page of this client's webhooks (``admin``: every client's), newest first,
    after the webhook ``after``; and whether more follow."""

    def read() -> tuple[list[Row], bool]:
        conn = core.db.reader()
        cursor: Row | None = None
        if after is not None:
            cursor = store.get(conn, after)
            if cursor is None or not client.oversees(cursor["client_id"]):
                raise errors.invalid(f"Unknown cursor {after!r}.", param="after")
        whose = None if client.admin else client.id
        rows = store.newest_first(conn, whose, cursor, limit + 1)
        return rows[:limit], len(rows) > limit

    return await core.read(read)


async def show(core: Core, webhook_id: str, client: Client) -> Row:
    return await core.read(lambda: owned(core.db.reader(), webhook_id, client))


async def update(
    core: Core,
    client: Client,
    webhook_id: str,
    *,
    url: str | None,
    events: list[str] | None,
    description: str | None,
) -> Row:
    """Change the URL, event types or description (``None``: it stays). Pending
    deliveries go to the new URL; ``updated_at`` moves only if something changed."""
    checked = None if url is None else checked_url(core, url)
    wanted = None if events is None else known_events(events)

    def job(conn: Conn) -> Row:
        owned(conn, webhook_id, client)
        changed = store.update(
            conn, webhook_id, url=checked, events=wanted, description=description
        )
        if changed is None:
            raise errors.not_found("webhook", webhook_id)
        row, change = changed
        if change:
            audit.record(conn, client.id, "webhook.updated", webhook_id, change)
        return row

    return await core.db.write(job)


async def remove(core: Core, webhook_id: str, client: Client) -> None:
    """Delete a webhook the client owns, audited: its pending deliveries are not sent."""

    def job(conn: Conn) -> None:
        owned(conn, webhook_id, client)
        store.delete(conn, webhook_id)
        audit.record(conn, client.id, "webhook.removed", webhook_id)

    await core.db.write(job)


async def rotate(core: Core, client: Client, webhook_id: str) -> tuple[Row, str]:
    """A new signing secret (the webhook's row and the secret, shown this once); the old
    one signs nothing from now on."""

    def job(conn: Conn) -> tuple[Row, str]:
        owned(conn, webhook_id, client)
        rotated = store.rotate(conn, webhook_id)
        if rotated is None:
            raise errors.not_found("webhook", webhook_id)
        audit.record(conn, client.id, "webhook.secret_rotated", webhook_id)
        return rotated

    return await core.db.write(job)


async def test(core: Core, client: Client, webhook_id: str, event_type: str) -> int:
    """Send one signed test event to the webhook's URL now: the status of its 2xx answer
    within 5 s. Not a delivery: not in the outbox, not retried, not in the deliveries
    list. Anything else is ``400 webhook_unreachable``, which tells an ``admin`` client
    what happened (the status, or the connection's error) and any other client nothing
    more, 5 s after the test began whatever happened: the test is no probe of which
    ports of this machine are open."""
    event_type = known_events([event_type], "event_type")[0]
    row = await show(core, webhook_id, client)
    url = checked_url(core, row["url"])  # the hosts allowed now, as for a delivery
    _test_due(core.webhook_tests, webhook_id)
    began = time.monotonic()
    hosts = wire.parse_hosts(core.settings.webhook_hosts)
    try:
        status = await sender.send_test(url, row["secret"], event_type, hosts)
        failure = None if 200 <= status < 300 else f"it answered {status}"
    except sender.NoAnswer as exc:
        failure = str(exc)
    if failure is None:
        return status
    log.info("webhook %s: the test event was not accepted: %s", webhook_id, failure)
    if not client.admin:  # the same answer at the same time, closed port or open
        await asyncio.sleep(sender.TEST_TIMEOUT - (time.monotonic() - began))
    raise errors.LmspError(
        "webhook_unreachable",
        "The webhook's URL did not accept the test event (no 2xx answer within"
        f" {sender.TEST_TIMEOUT:.0f} s){f': {failure}' if client.admin else ''}.",
        param="url",
    )


def _test_due(sent: dict[str, float], webhook_id: str) -> None:
    """Note a test of ``webhook_id`` now, or ``429 rate_limit_exceeded`` (with
    ``Retry-After``) if its last one was less than :data:`TEST_INTERVAL` ago."""
    now = time.monotonic()
    last = sent.get(webhook_id)
    if last is not None and now - last < TEST_INTERVAL:
        raise errors.LmspError(
            "rate_limit_exceeded",
            f"A webhook is tested at most once every {TEST_INTERVAL:.0f} s; try again shortly.",
            headers={"Retry-After": str(math.ceil(TEST_INTERVAL - (now - last)))},
        )
    if len(sent) > 1000:  # forget the webhooks not tested lately
        for old in [k for k, t in sent.items() if now - t >= TEST_INTERVAL]:
            del sent[old]
    sent[webhook_id] = now


async def deliveries(
    core: Core, webhook_id: str, client: Client, limit: int, after: str | None
) -> dict[str, Any]:
    """The webhook's deliveries, newest first (after the event ``after``): event,
    status, tries, next try (the details for an ``admin``)."""
    return await core.read(_deliveries, core, webhook_id, client, limit, after)


def _deliveries(
    core: Core, webhook_id: str, client: Client, limit: int, after: str | None
) -> dict[str, Any]:
    conn = core.db.reader()
    owned(conn, webhook_id, client)
    before: int | None = None
    if after is not None:
        before = store.delivery_seq(conn, webhook_id, after)
        if before is None:
            raise errors.invalid(f"Unknown cursor {after!r}.", param="after")
    rows = store.deliveries(conn, webhook_id, before, limit + 1)
    data = [store.render_delivery(row, detailed=client.admin) for row in rows[:limit]]
    return objects.list_page(data, len(rows) > limit)
