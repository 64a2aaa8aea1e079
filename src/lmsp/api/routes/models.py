"""``/v1/models``: list, retrieve, import (``POST``), delete and verify models.

Imports and verifications read whole files, so they run in a worker thread; the
blob-store workflows themselves live in :mod:`lmsp.store.blobs`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.schemas import MinP, Penalty, RepeatPenalty, Temperature, TopK, TopP
from lmsp.app import remote_models
from lmsp.store import audit, blobs, models
from lmsp.store.clients import Client
from lmsp.store.models import ModelRecord

router = APIRouter(prefix="/v1/models", tags=["models"])

ModelReader = Annotated[Client, Depends(require("models:read"))]
ModelWriter = Annotated[Client, Depends(require("models:write"))]

ModelId = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]


class ModelDefaults(BaseModel):
    """Sampling defaults of a model: what a request that does not name a value runs
    with (``null`` in a ``PATCH`` removes one: lmsp's default applies again)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: RepeatPenalty | None = None

    def given(self) -> dict[str, Any]:
        """The values the body named (``None``: remove)."""
        return self.model_dump(exclude_unset=True)


class ChangeModel(BaseModel):
    """``PATCH /v1/models/{id}``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    defaults: ModelDefaults


Url = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=2048)]


class RemoteUpstream(BaseModel):
    """Where a remote model is served (docs/remote-engines.md): an OpenAI-compatible
    upstream's base URL, the model id it serves the model under, the environment
    variable holding its API key (never the key), and how many of lmsp's sequences may
    stream from it at once (at most its own sequences ÷ the nodes sharing it)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    url: Url
    #: more upstreams serving the same model: a sequence goes to its prompt prefix's
    #: replica unless another is less loaded (docs/remote-engines.md)
    replicas: Annotated[list[Url], Field(max_length=16)] = []
    upstream_model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    api_key_env: (
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
        | None
    ) = None
    inflight: Annotated[int, Field(ge=1, le=1024)] = 4


class ImportModel(BaseModel):
    """``POST /v1/models``: a local file to copy into the blob store under a new id.
    ``digest`` (optional, ``sha256:<hex>``) is what the caller hashed: the import fails
    with ``digest_mismatch`` if the file read differs."""

    model_config = ConfigDict(strict=True, extra="ignore")

    id: ModelId
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    digest: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    defaults: ModelDefaults | None = None
    #: a remote model: ``path`` is then its tokenizer (a GGUF)
    remote: RemoteUpstream | None = None


def render(request: Request, record: ModelRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "model",
        "created": record.created_at,
        "owned_by": record.owned_by,
        "digest": record.digest,
        "size_bytes": record.size_bytes,
        "format": record.format,
        "loaded": service(request).host.is_loaded(record.id),
        # one sequence's context here (LMSP_N_CTX, LMSP_KV_BUDGET); the trained one is
        # the metadata's context_length
        "context_length": service(request).host.context_length(record),
        "status": record.status,
        "capabilities": list(models.capabilities(record)),
        "verified_at": record.verified_at,
        "metadata": record.metadata,
        "defaults": record.defaults,
        "remote": record.remote,
    }


@router.get("")
async def list_models(request: Request, client: ModelReader) -> dict[str, Any]:
    svc = service(request)

    def listing() -> list[dict[str, Any]]:  # a file's header may be read: off the loop
        return [render(request, r) for r in models.all_models(svc.db.reader())]

    return {"object": "list", "data": await svc.read(listing)}


@router.get("/{model_id:path}")
async def get_model(model_id: str, request: Request, client: ModelReader) -> dict[str, Any]:
    svc = service(request)
    record = models.get(svc.db.reader(), model_id)
    if record is None:
        raise errors.not_found("model", model_id)
    return await svc.read(render, request, record)


@router.post("", status_code=201)
async def import_model(body: ImportModel, request: Request, client: ModelWriter) -> JSONResponse:
    svc = service(request)
    defaults = None if body.defaults is None else _set(body.defaults.given())
    if body.remote is not None:
        given = body.remote.model_dump()
        record = await asyncio.to_thread(
            remote_models.add_remote,
            svc.db,
            svc.settings.blobs_dir,
            body.id,
            Path(body.path),
            given,
            defaults,
        )
    else:
        record = await asyncio.to_thread(
            blobs.import_model,
            svc.db,
            svc.settings.blobs_dir,
            body.id,
            Path(body.path),
            body.digest,
            defaults=defaults,
        )
    change = {
        "digest": record.digest,
        "size_bytes": record.size_bytes,
        "remote": body.remote is not None,
    }
    await svc.db.write(lambda c: audit.record(c, client.id, "model.added", body.id, change))
    return JSONResponse(render(request, record), 201, headers={"Location": f"/v1/models/{body.id}"})


def _set(given: dict[str, Any]) -> dict[str, float | int]:
    return {name: value for name, value in given.items() if value is not None}


@router.patch("/{model_id:path}")
async def change_model(
    model_id: str, body: ChangeModel, request: Request, client: ModelWriter
) -> dict[str, Any]:
    """Change a model's sampling defaults (responses created from now on use them)."""
    svc = service(request)
    changes = body.defaults.given()
    record = await svc.db.write(lambda c: models.set_defaults(c, model_id, changes))
    if record is None:
        raise errors.not_found("model", model_id)
    return render(request, record)


@router.post("/{model_id:path}/verify")
async def verify_model(model_id: str, request: Request, client: ModelWriter) -> dict[str, Any]:
    """Recompute the model's full digest; ``status`` becomes ``ready`` or ``corrupt``."""
    svc = service(request)
    record, problem = await asyncio.to_thread(
        blobs.verify, svc.db, svc.settings.blobs_dir, model_id
    )
    svc.host.verified(record.digest, problem is None)
    if problem is not None:
        svc.host.evict(record)
    return dict(render(request, record), problem=problem)


@router.delete("/{model_id:path}")
async def delete_model(model_id: str, request: Request, client: ModelWriter) -> dict[str, Any]:
    svc = service(request)
    record = await asyncio.to_thread(blobs.delete_model, svc.db, svc.settings.blobs_dir, model_id)
    gone = {"digest": record.digest}
    await svc.db.write(lambda c: audit.record(c, client.id, "model.removed", model_id, gone))
    svc.host.evict(record)
    kv = svc.kv
    if kv is not None and not await svc.read(
        lambda: models.referenced(svc.db.reader(), record.digest)
    ):
        await asyncio.to_thread(kv.forget, record.digest)  # its saved prefixes go too
    return {"id": model_id, "object": "model", "deleted": True}
