"""``/healthz`` and ``/v1/service`` (the model routes are in :mod:`.models`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmsp import PROTOCOL, __version__

from .deps import service

router = APIRouter(tags=["service"])


@router.get("/healthz", responses={503: {"description": "Degraded: writes fail"}})
async def healthz(request: Request) -> JSONResponse:
    """``200 {"status": "ok"}`` once startup recovery is done; ``503`` with ``"status":
    "degraded"`` while the storage refuses writes (a full disk): reads work, new work is
    refused with ``507``, and the runner retries its tasks' last writes until they
    commit."""
    report = service(request).db.health.report()
    if report.status == "ok":
        return JSONResponse({"status": "ok"})
    return JSONResponse(report.as_dict(), 503, headers={"Retry-After": "5"})


@router.get("/v1/service")
async def service_info(request: Request) -> dict[str, Any]:
    svc = service(request)
    return {
        "object": "service",
        "id": svc.service_id,
        "name": "lmsp",
        "protocol": PROTOCOL,
        "version": __version__,
        "started_at": svc.started_at,
    }
