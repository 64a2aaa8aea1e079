"""``/healthz``, ``/v1/service`` and ``/v1/models``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lmsp import PROTOCOL, __version__, errors
from lmsp.store import models
from lmsp.store.clients import Client
from lmsp.store.models import ModelRecord

from ..auth import require
from .deps import service

router = APIRouter(tags=["service"])

ModelReader = Annotated[Client, Depends(require("models:read"))]


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


def _model(request: Request, record: ModelRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "model",
        "created": record.created_at,
        "owned_by": record.owned_by,
        "digest": record.digest,
        "size_bytes": record.size_bytes,
        "format": record.format,
        "loaded": service(request).host.is_loaded(record.id),
    }


@router.get("/v1/models")
async def list_models(request: Request, client: ModelReader) -> dict[str, Any]:
    records = models.all_models(service(request).db.reader())
    return {"object": "list", "data": [_model(request, r) for r in records]}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request, client: ModelReader) -> dict[str, Any]:
    record = models.get(service(request).db.reader(), model_id)
    if record is None:
        raise errors.not_found("model", model_id)
    return _model(request, record)
