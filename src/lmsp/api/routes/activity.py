"""``GET /v1/service/activity`` (``admin``): what the service is doing now, for
``lmsp ps`` and the console (:mod:`lmsp.app.activity`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.app import activity as activities
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/service", tags=["service"])

Admin = Annotated[Client, Depends(require("admin"))]


@router.get("/activity")
async def activity(request: Request, client: Admin) -> dict[str, Any]:
    shown = await activities.activity(service(request))
    shown["websockets"] = request.app.state.lmsp_sockets.activity()  # HTTP's own state
    return shown
