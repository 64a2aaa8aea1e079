"""``/v1/clients`` (``admin``): list, create (the token is shown once), revoke."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.store import clients
from lmsp.store import service as config_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

from ..auth import require
from .deps import service

router = APIRouter(prefix="/v1/clients", tags=["clients"])

Admin = Annotated[Client, Depends(require("admin"))]
Scope = Literal["models:read", "models:write", "responses:read", "responses:write", "admin"]


class NewClient(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    scopes: Annotated[list[Scope], Field(min_length=1)]


@router.get("")
async def list_clients(request: Request, client: Admin) -> dict[str, Any]:
    rows = clients.all_clients(service(request).db.reader())
    return {"object": "list", "data": [clients.render(r) for r in rows]}


@router.post("", status_code=201)
async def create_client(body: NewClient, request: Request, client: Admin) -> JSONResponse:
    """A new client and its token; the token is in this answer only."""
    svc = service(request)
    scopes = clients.clean_scopes(body.scopes)

    def job(conn: Conn) -> dict[str, Any]:
        created, token = clients.add(conn, body.name, scopes)
        row = clients.get(conn, created.id)
        assert row is not None
        return dict(clients.render(row), token=token)

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
        row = clients.revoke(conn, client_id)
        assert row is not None
        # in the revoke's own transaction, through the guarded cancel of the API: no
        # task of a revoked client can be claimed after the revoke commits
        moved = [
            task_store.cancel(conn, task) for task in task_store.unfinished_of(conn, client_id)
        ]
        return row, [task for task in moved if task is not None]

    row, cancelled = await svc.db.write(job)
    svc.cancelled(cancelled, why=f"client {client_id} revoked")
    return dict(clients.render(row), revoked=True, cancelled_tasks=[t["id"] for t in cancelled])
