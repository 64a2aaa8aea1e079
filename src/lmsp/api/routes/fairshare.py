"""``GET /v1/usage`` (a client its own, ``admin`` everyone's) and ``GET /v1/audit``
(``admin``): PROTOCOL.md section 13."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.app import usage
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1", tags=["fair share"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Admin = Annotated[Client, Depends(require("admin"))]
Stamp = Annotated[int, Query(ge=0, le=2**53)]


@router.get("/usage")
async def get_usage(
    request: Request,
    client: Reader,
    client_id: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    since: Stamp | None = None,
    until: Stamp | None = None,
    group_by: Annotated[list[Literal["day", "model"]], Query(max_length=2)] = ["day"],  # noqa: B006
) -> dict[str, Any]:
    """Requests, input, cached and output tokens per client and per UTC day and/or
    model, over the days from ``since`` to ``until`` (Unix times). A client sees its
    own; ``admin`` everyone's, or one client's with ``?client_id=``."""
    rows = await usage.summary(service(request), client, client_id, since, until, group_by)
    return {"object": "list", "group_by": list(group_by), "data": rows}


@router.get("/audit")
async def get_audit(
    request: Request,
    client: Admin,
    after: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    target: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    action: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> dict[str, Any]:
    """The audit log, oldest first, a page after the row id ``after``."""
    return await usage.audit_page(service(request), after, limit, target, action)
