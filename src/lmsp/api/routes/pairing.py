"""``/v1/pairing``: the device flow of PROTOCOL.md section 2.

Requesting and polling need no token (the agent has none yet); listing, approving and
denying need ``admin``. ``{pairing_id}`` in approve/deny is the request id or its user
code (``ABCD-EFGH``), so an operator can act on what the agent shows.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.console import console_origin
from lmsp.api.routes.deps import service
from lmsp.api.routes.meta import loopback
from lmsp.store import audit, clients, limits, pairing
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

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


def _now() -> int:
    return int(time.time())


@router.post("", status_code=201)
async def request_pairing(body: PairingRequest, request: Request) -> JSONResponse:
    svc = service(request)
    scopes = clients.clean_scopes(body.scopes)

    source = request.client.host if request.client else ""
    # every agent on this machine comes from one loopback address: there the client
    # name tells them apart, and a per-address limit would let one block the others
    per_source = None if loopback(source) else svc.settings.max_pending_pairings_per_source
    # and peers beyond this machine together hold at most half the slots
    remote = max(1, svc.settings.max_pending_pairings // 2) if pairing.is_remote(source) else None

    def job(conn: Conn) -> Row:
        return pairing.create(
            conn,
            client_name=body.client_name,
            scopes=scopes,
            ttl=int(svc.settings.pairing_ttl),
            max_pending=svc.settings.max_pending_pairings,
            now=_now(),
            source=source,
            max_per_source=per_source,
            max_per_name=svc.settings.max_pending_pairings_per_name,
            max_remote=remote,
        )

    row = await svc.db.write(job)
    shown = pairing.render(row)
    # RFC 8628: where the operator approves it, in the console, on the one origin its
    # login links use (not the Host this agent happened to call)
    page = f"{console_origin(svc.settings, request)}/console/pair"
    shown["verification_uri"] = page
    shown["verification_uri_complete"] = f"{page}?user_code={shown['user_code']}"
    return JSONResponse(shown, 201)


@router.get("")
async def list_pairing(request: Request, client: Admin) -> dict[str, Any]:
    """Pending, unexpired requests, oldest first."""
    rows = pairing.pending(service(request).db.reader(), _now())
    return {"object": "list", "data": [pairing.render(r) for r in rows]}


@router.delete("")
async def clear_pairing(
    request: Request, client: Admin, source: str | None = None
) -> dict[str, Any]:
    """Deny every pending request, or only those from ``?source=`` (an address as
    ``GET /v1/pairing`` shows it): the operator frees the slots."""
    svc = service(request)
    now = _now()

    def job(conn: Conn) -> list[str]:
        denied: list[str] = pairing.deny_pending(conn, now, source)
        for pairing_id in denied:
            audit.record(conn, client.id, "pairing.denied", pairing_id, {"source": source})
        return denied

    ids = await svc.db.write(job)
    conn = svc.db.reader()
    rows = [row for i in ids if (row := pairing.get(conn, i)) is not None]
    return {"object": "list", "data": [pairing.render(row) for row in rows]}


async def _decide(
    request: Request, pairing_id: str, approve: bool, body: Decision | None, actor: Client
) -> dict[str, Any]:
    svc = service(request)
    scopes = None if body is None or body.scopes is None else clients.clean_scopes(body.scopes)

    def job(conn: Conn) -> Row:
        row = pairing.decide(conn, pairing_id, approve=approve, scopes=scopes, now=_now())
        shown = pairing.render(row)
        audit.record(
            conn,
            actor.id,
            "pairing.approved" if approve else "pairing.denied",
            str(row["id"]),
            {"client_name": row["client_name"], "scopes": shown.get("granted_scopes")},
        )
        return row

    return pairing.render(await svc.db.write(job))


@router.post("/{pairing_id}/approve")
async def approve_pairing(
    pairing_id: str, request: Request, client: Admin, body: Decision | None = None
) -> dict[str, Any]:
    """Approve, optionally with fewer scopes than requested (``{"scopes": […]}``)."""
    return await _decide(request, pairing_id, True, body, client)


@router.post("/{pairing_id}/deny")
async def deny_pairing(pairing_id: str, request: Request, client: Admin) -> dict[str, Any]:
    return await _decide(request, pairing_id, False, None, client)


@router.post("/{pairing_id}/token")
async def claim_token(pairing_id: str, request: Request) -> dict[str, Any]:
    """``400`` (``authorization_pending``, ``access_denied``, ``expired_token``,
    ``already_claimed``) until approved; then the new client's token, exactly once."""
    svc = service(request)
    defaults = dict(svc.settings.default_limits)

    def job(conn: Conn) -> dict[str, Any]:
        result: dict[str, Any] = pairing.claim(conn, pairing_id, _now())
        limits.update(conn, result["client_id"], defaults)  # LMSP_DEFAULT_LIMITS
        audit.record(
            conn,
            f"pairing:{pairing_id}",
            "client.created",
            result["client_id"],
            {"scopes": result.get("scopes"), "limits": limits.of(conn, result["client_id"])},
        )
        return result

    return await svc.db.write(job)
