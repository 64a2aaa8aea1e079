"""``/v1/clients`` (``admin``): list, create (the token is shown once), change (limits,
scopes), revoke. Every change is recorded in the audit log (:mod:`lmsp.store.audit`)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.store import audit, clients, limits
from lmsp.store import service as config_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

router = APIRouter(prefix="/v1/clients", tags=["clients"])

Admin = Annotated[Client, Depends(require("admin"))]
Scope = Literal[
    "models:read", "models:write", "responses:read", "responses:write", "admin", "priority"
]
Limit = Annotated[int, Field(ge=1, le=2**53)]


class NewClient(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    scopes: Annotated[list[Scope], Field(min_length=1)]


class Limits(BaseModel):
    """Each limit a whole number of at least 1, or ``null`` to lift it; a limit not
    named stays as it is."""

    model_config = ConfigDict(strict=True, extra="forbid")
    max_queued: Limit | None = None
    max_running: Limit | None = None
    tokens_per_minute: Limit | None = None
    tokens_per_day: Limit | None = None


class ClientChange(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    limits: Limits | None = None
    scopes: Annotated[list[Scope], Field(min_length=1)] | None = None


def _render(conn: Conn, row: Row) -> dict[str, Any]:
    return dict(clients.render(row), limits=limits.of(conn, row["id"]))


@router.get("")
async def list_clients(request: Request, client: Admin) -> dict[str, Any]:
    conn = service(request).db.reader()
    rows = clients.all_clients(conn)
    return {"object": "list", "data": [_render(conn, r) for r in rows]}


@router.post("", status_code=201)
async def create_client(body: NewClient, request: Request, client: Admin) -> JSONResponse:
    """A new client and its token; the token is in this answer only."""
    svc = service(request)
    scopes = clients.clean_scopes(body.scopes)

    defaults = dict(svc.settings.default_limits)

    def job(conn: Conn) -> dict[str, Any]:
        created, token = clients.add(conn, body.name, scopes)
        limits.update(conn, created.id, defaults)  # LMSP_DEFAULT_LIMITS
        change = {"name": body.name, "scopes": scopes, "limits": limits.of(conn, created.id)}
        audit.record(conn, client.id, "client.created", created.id, change)
        row = clients.get(conn, created.id)
        assert row is not None
        return dict(_render(conn, row), token=token)

    return JSONResponse(await svc.db.write(job), 201)


@router.delete("/{client_id}")
async def revoke_client(client_id: str, request: Request, client: Admin) -> dict[str, Any]:
    """Revoke: the token stops working with the next request, its open streams end,
    and its queued and running tasks are cancelled (``cancelled_tasks``: their ids).
    Its finished tasks and responses stay."""
    svc = service(request)

    def job(conn: Conn) -> tuple[Row, list[Row]]:
        if clients.get(conn, client_id) is None:
            raise errors.not_found("client", client_id)
        if config_store.get(conn, "owner_client_id") == client_id:
            raise errors.LmspError(
                "owner_client", "The owner client cannot be revoked (its token is on disk)."
            )
        already = clients.get(conn, client_id)
        row = clients.revoke(conn, client_id)
        assert row is not None and already is not None
        if already["revoked_at"] is None:
            audit.record(conn, client.id, "client.revoked", client_id, {"name": row["name"]})
        # in the revoke's own transaction, through the guarded cancel of the API: no
        # task of a revoked client can be claimed after the revoke commits
        moved = [
            task_store.cancel(conn, task) for task in task_store.unfinished_of(conn, client_id)
        ]
        return row, [task for task in moved if task is not None]

    row, cancelled = await svc.db.write(job)
    svc.cancelled(cancelled, why=f"client {client_id} revoked")
    return dict(clients.render(row), revoked=True, cancelled_tasks=[t["id"] for t in cancelled])


@router.patch("/{client_id}")
async def change_client(
    client_id: str, body: ClientChange, request: Request, client: Admin
) -> dict[str, Any]:
    """Set or lift a client's limits (``{"limits": {"max_queued": 2, "tokens_per_day":
    null}}``) or replace its scopes; the owner's limits cannot be set (it is never
    limited), nor its scopes changed."""
    svc = service(request)
    given = body.limits.model_dump(exclude_unset=True) if body.limits is not None else {}
    scopes = None if body.scopes is None else clients.clean_scopes(body.scopes)

    def job(conn: Conn) -> dict[str, Any]:
        row = clients.get(conn, client_id)
        if row is None:
            raise errors.not_found("client", client_id)
        if config_store.get(conn, "owner_client_id") == client_id and (given or scopes):
            raise errors.LmspError(
                "owner_client", "The owner client is never limited and keeps its scopes."
            )
        if given:
            changed = limits.update(conn, client_id, given)
            if changed["before"] != changed["after"]:
                audit.record(conn, client.id, "client.limits_changed", client_id, changed)
        if scopes is not None:
            before = json.loads(row["scopes"])
            if before != scopes:
                clients.set_scopes(conn, client_id, scopes)
                audit.record(
                    conn,
                    client.id,
                    "client.scopes_changed",
                    client_id,
                    {"before": before, "after": scopes},
                )
        fresh = clients.get(conn, client_id)
        assert fresh is not None
        return _render(conn, fresh)

    return await svc.db.write(job)
