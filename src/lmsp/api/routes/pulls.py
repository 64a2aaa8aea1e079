"""``POST /v1/models/pull``: a model by name from the hub, as a durable task (PROTOCOL.md
section 12; :mod:`lmsp.app.pulls`): ``202`` with the pull's task, at its ``Location``.
Pulling the same reference again while its pull is unfinished answers that pull's task.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.deps import idempotency_key, service
from lmsp.api.routes.models import ModelId
from lmsp.app import pulls
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/models", tags=["models"])

ModelWriter = Annotated[Client, Depends(require("models:write"))]


class PullModel(BaseModel):
    """``{"from": "hf.co/{owner}/{repo}:{quant}", "id"?}``."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    source: Annotated[str, StringConstraints(min_length=1, max_length=300)] = Field(alias="from")
    id: ModelId | None = None


@router.post("/pull", status_code=202)
async def pull_model(body: PullModel, request: Request, client: ModelWriter) -> JSONResponse:
    target = pulls.target(body.source, body.id)
    key = await idempotency_key(request, client)
    pulled = await pulls.pull(service(request), client, target, key)
    shown = {"object": "model.pull", "task": pulled.task_object, "model": pulled.model_id}
    headers = {"Location": f"/v1/tasks/{pulled.task_object['id']}"}
    if pulled.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(shown, 202, headers=headers)
