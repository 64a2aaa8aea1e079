"""``/v1/pairing``: the device flow of PROTOCOL.md section 2 (:mod:`lmsp.app.pairing`).

Requesting and polling need no token (the agent has none yet); listing, approving and
denying need ``admin``. ``{pairing_id}`` in approve/deny is the request id or its user
code (``ABCD-EFGH``), so an operator can act on what the agent shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.console import console_origin
from lmsp.api.routes.deps import service
from lmsp.api.routes.meta import loopback
from lmsp.app import pairing
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/pairing", tags=["pairing"])

Admin = Annotated[Client, Depends(require("admin"))]
Scope = Literal[
    "models:read", "models:write", "responses:read", "responses:write", "admin", "priority"
]
DEFAULT_SCOPES: list[Scope] = ["models:read", "responses:read", "responses:write"]


class PairingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    client_name: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    scopes: Annotated[list[Scope], Field(min_length=1)] = Field(
        default_factory=lambda: list(DEFAULT_SCOPES)
    )


class Decision(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    scopes: Annotated[list[Scope], Field(min_length=1)] | None = None


@router.post("", status_code=201)
async def request_pairing(body: PairingRequest, request: Request) -> JSONResponse:
    svc = service(request)
    source = request.client.host if request.client else ""
    shown = await pairing.request(svc, body.client_name, body.scopes, source, loopback(source))
    # RFC 8628: where the operator approves it, in the console, on the one origin its
    # login links use (not the Host this agent happened to call)
    page = f"{console_origin(svc.settings, request)}/console/pair"
    shown["verification_uri"] = page
    shown["verification_uri_complete"] = f"{page}?user_code={shown['user_code']}"
    return JSONResponse(shown, 201)


@router.get("")
async def list_pairing(request: Request, client: Admin) -> dict[str, Any]:
    """Pending, unexpired requests, oldest first."""
    return {"object": "list", "data": await pairing.pending(service(request))}


@router.delete("")
async def clear_pairing(
    request: Request, client: Admin, source: str | None = None
) -> dict[str, Any]:
    """Deny every pending request, or only those from ``?source=`` (an address as
    ``GET /v1/pairing`` shows it): the operator frees the slots."""
    return {"object": "list", "data": await pairing.deny_pending(service(request), client, source)}


@router.post("/{pairing_id}/approve")
async def approve_pairing(
    pairing_id: str, request: Request, client: Admin, body: Decision | None = None
) -> dict[str, Any]:
    """Approve, optionally with fewer scopes than requested (``{"scopes": […]}``)."""
    scopes = None if body is None or body.scopes is None else body.scopes
    return await pairing.decide(service(request), client, pairing_id, True, scopes)


@router.post("/{pairing_id}/deny")
async def deny_pairing(pairing_id: str, request: Request, client: Admin) -> dict[str, Any]:
    return await pairing.decide(service(request), client, pairing_id, False)


@router.post("/{pairing_id}/token")
async def claim_token(pairing_id: str, request: Request) -> dict[str, Any]:
    """``400`` (``authorization_pending``, ``access_denied``, ``expired_token``,
    ``already_claimed``) until approved; then the new client's token, exactly once."""
    return await pairing.claim(service(request), pairing_id)
