"""Clients (``admin``): list, create (the token is shown once), change (limits, scopes),
revoke; and what authentication records of a client: its last use, its console
sign-in. Every change is recorded in the audit log (:mod:`lmsp.store.audit`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lmsp import errors
from lmsp.app import tasks
from lmsp.app.core import Core
from lmsp.protocol.records import TaskRecord
from lmsp.store import audit, clients, limits
from lmsp.store import service as config_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

OWNER = "owner_client_id"


def shown(conn: Conn, row: Row) -> dict[str, Any]:
    """The client object with its limits."""
    return dict(clients.render(row), limits=limits.of(conn, row["id"]))


async def listing(core: Core) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        conn = core.db.reader()
        return [shown(conn, r) for r in clients.all_clients(conn)]

    return await core.read(read)


async def create(core: Core, actor: Client, name: str, scopes: Sequence[str]) -> dict[str, Any]:
    """A new client with the default limits (``LMSP_DEFAULT_LIMITS``) and its token,
    which is in this answer only."""
    wanted = clients.clean_scopes(scopes)
    defaults = dict(core.settings.default_limits)

    def job(conn: Conn) -> dict[str, Any]:
        created, token = clients.add(conn, name, wanted)
        limits.update(conn, created.id, defaults)
        change = {"name": name, "scopes": wanted, "limits": limits.of(conn, created.id)}
        audit.record(conn, actor.id, "client.created", created.id, change)
        row = clients.get(conn, created.id)
        assert row is not None
        return dict(shown(conn, row), token=token)

    return await core.db.write(job)


async def revoke(core: Core, actor: Client, client_id: str) -> dict[str, Any]:
    """Revoke: the token stops working with the next request, its open streams end,
    and its queued and running tasks are cancelled (``cancelled_tasks``: their ids).
    Its finished tasks and responses stay."""

    def job(conn: Conn) -> tuple[Row, list[TaskRecord]]:
        already = clients.get(conn, client_id)
        if already is None:
            raise errors.not_found("client", client_id)
        if config_store.get(conn, OWNER) == client_id:
            raise errors.LmspError(
                "owner_client", "The owner client cannot be revoked (its token is on disk)."
            )
        row = clients.revoke(conn, client_id)
        assert row is not None
        if already["revoked_at"] is None:
            audit.record(conn, actor.id, "client.revoked", client_id, {"name": row["name"]})
        # in the revoke's own transaction, through the guarded cancel of the API: no
        # task of a revoked client can be claimed after the revoke commits
        moved = [
            task_store.cancel(conn, task) for task in task_store.unfinished_of(conn, client_id)
        ]
        return row, [task for task in moved if task is not None]

    row, cancelled = await core.db.write(job)
    tasks.cancelled(core, cancelled, why=f"client {client_id} revoked")
    return dict(clients.render(row), revoked=True, cancelled_tasks=[t.id for t in cancelled])


async def change(
    core: Core,
    actor: Client,
    client_id: str,
    given: Mapping[str, int | None],
    scopes: Sequence[str] | None,
) -> dict[str, Any]:
    """Set or lift a client's limits (``given``: a ``None`` lifts one) or replace its
    scopes; the owner's limits cannot be set (it is never limited), nor its scopes
    changed."""
    wanted = None if scopes is None else clients.clean_scopes(scopes)

    def job(conn: Conn) -> dict[str, Any]:
        row = clients.get(conn, client_id)
        if row is None:
            raise errors.not_found("client", client_id)
        if config_store.get(conn, OWNER) == client_id and (given or wanted):
            raise errors.LmspError(
                "owner_client", "The owner client is never limited and keeps its scopes."
            )
        if given:
            changed = limits.update(conn, client_id, given)
            if changed["before"] != changed["after"]:
                audit.record(conn, actor.id, "client.limits_changed", client_id, changed)
        if wanted is not None:
            before = json.loads(row["scopes"])
            if before != wanted:
                clients.set_scopes(conn, client_id, wanted)
                change = {"before": before, "after": wanted}
                audit.record(conn, actor.id, "client.scopes_changed", client_id, change)
        fresh = clients.get(conn, client_id)
        assert fresh is not None
        return shown(conn, fresh)

    return await core.db.write(job)


# -- what authentication records ------------------------------------------------------------
async def record_use(core: Core, client: Client) -> None:
    """Keep ``last_used_at``: at most one write a minute per client, through the writer
    (a full disk fails no read: the use is recorded another time)."""
    now = int(time.time())
    if not clients.needs_touch(client, now):
        return
    if now - core.touched.get(client.id, 0) < clients.TOUCH_INTERVAL:
        return
    core.touched[client.id] = now
    try:
        await core.db.write(lambda c: clients.touch(c, client.id, now))
    except errors.LmspError as exc:
        if exc.code != "insufficient_storage":
            raise
        core.touched.pop(client.id, None)


def active(core: Core, client_id: str) -> Client | None:
    """The client ``client_id`` unless it was revoked (a console session's client)."""
    return clients.load(core.db.reader(), client_id)


async def signed_in(core: Core, client_id: str) -> Client | None:
    """A console sign-in of ``client_id``, audited; ``None`` if it was revoked since its
    login link was made."""
    client = active(core, client_id)
    if client is not None:
        await core.db.write(lambda c: audit.record(c, client.id, "console.login", client.id))
    return client


def owner(core: Core) -> str | None:
    """The owner client's id (``None`` before the first start made it)."""
    return config_store.get(core.db.reader(), OWNER)
