"""``/healthz`` and ``/v1/service`` (the model routes are in :mod:`.models`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmsp import PROTOCOL, __version__

from .deps import service

router = APIRouter(tags=["service"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


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
