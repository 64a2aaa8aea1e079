"""``/healthz``, ``/v1/service`` and ``/metrics`` (the model routes are in :mod:`.models`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lmsp.api.auth import authorize
from lmsp.api.routes.deps import service
from lmsp.app import health
from lmsp.metrics import CONTENT_TYPE
from lmsp.protocol import outbound

router = APIRouter(tags=["service"])


@router.get("/healthz", responses={503: {"description": "Degraded: writes fail"}})
async def healthz(request: Request) -> JSONResponse:
    """``200 {"status": "ok"}`` once startup recovery is done; ``503`` with ``"status":
    "degraded"`` while the storage refuses writes (a full disk): reads work, new work is
    refused with ``507``, and the runner retries its tasks' last writes until they
    commit. ``engines`` lists each model's engine process (``state``, ``pid``,
    ``restarts``, ``crashes``): an engine crash leaves the service up, restarting it.
    A model whose engine kept crashing past ``LMSP_ENGINE_RESTARTS`` cannot run: then
    ``200`` with ``"status": "degraded"`` and ``failed_models`` (each ``model`` and its
    ``error``): the service serves, that model does not."""
    found = health.health(service(request))
    if found.writable:
        return JSONResponse(found.shown)
    return JSONResponse(found.shown, 503, headers={"Retry-After": "5"})


@router.get("/v1/service")
async def service_info(request: Request) -> dict[str, Any]:
    return health.identity(service(request))


def loopback(host: str) -> bool:
    """Whether the service listens on the loopback interface only."""
    return outbound.loopback(host)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
        401: {"description": "Bound beyond loopback and no admin token"},
    },
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (text format 0.0.4). Readable without a token while the
    service is bound to a loopback address (the default, ``127.0.0.1``); bound to any
    other address (``LMSP_HOST=0.0.0.0``), it needs a token with ``admin``."""
    svc = service(request)
    if not loopback(svc.settings.host):
        await authorize(request, "admin")
    return Response(svc.metrics.exposition(), media_type=CONTENT_TYPE)
