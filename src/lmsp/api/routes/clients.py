"""``/v1/clients`` (``admin``): list, create (the token is shown once), change (limits,
scopes), revoke (:mod:`lmsp.app.clients`). Every change is recorded in the audit log
(:mod:`lmsp.store.audit`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.app import clients
from lmsp.store.clients import Client

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


@router.get("")
async def list_clients(request: Request, client: Admin) -> dict[str, Any]:
    return {"object": "list", "data": await clients.listing(service(request))}


@router.post("", status_code=201)
async def create_client(body: NewClient, request: Request, client: Admin) -> JSONResponse:
    """A new client and its token; the token is in this answer only."""
    made = await clients.create(service(request), client, body.name, body.scopes)
    return JSONResponse(made, 201)


@router.delete("/{client_id}")
async def revoke_client(client_id: str, request: Request, client: Admin) -> dict[str, Any]:
    """Revoke: the token stops working with the next request, its open streams end,
    and its queued and running tasks are cancelled (``cancelled_tasks``: their ids).
    Its finished tasks and responses stay."""
    return await clients.revoke(service(request), client, client_id)


@router.patch("/{client_id}")
async def change_client(
    client_id: str, body: ClientChange, request: Request, client: Admin
) -> dict[str, Any]:
    """Set or lift a client's limits (``{"limits": {"max_queued": 2, "tokens_per_day":
    null}}``) or replace its scopes; the owner's limits cannot be set (it is never
    limited), nor its scopes changed."""
    given = body.limits.model_dump(exclude_unset=True) if body.limits is not None else {}
    scopes = None if body.scopes is None else body.scopes
    return await clients.change(service(request), client, client_id, given, scopes)
