"""``/v1/models``: list, retrieve, import (``POST``), delete and verify models
(:mod:`lmsp.app.models`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.deps import deleted, service
from lmsp.api.schemas import MinP, Penalty, RepeatPenalty, Temperature, TopK, TopP
from lmsp.app import models
from lmsp.store.clients import Client

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
    #: a remote model: ``path`` is then its tokenizer (a GGUF or a tokenizer.json on the
    #: service's machine, or a hub reference ``hf.co/{owner}/{repo}[:{quant}]`` fetched)
    remote: RemoteUpstream | None = None


@router.get("")
async def list_models(request: Request, client: ModelReader) -> dict[str, Any]:
    return {"object": "list", "data": await models.listing(service(request))}


@router.get("/{model_id:path}")
async def get_model(model_id: str, request: Request, client: ModelReader) -> dict[str, Any]:
    return await models.show(service(request), model_id)


@router.post("", status_code=201)
async def import_model(body: ImportModel, request: Request, client: ModelWriter) -> JSONResponse:
    defaults = None if body.defaults is None else body.defaults.given()
    remote = None if body.remote is None else body.remote.model_dump()
    shown = await models.import_model(
        service(request), client, body.id, body.path, body.digest, defaults, remote
    )
    return JSONResponse(shown, 201, headers={"Location": f"/v1/models/{body.id}"})


@router.patch("/{model_id:path}")
async def change_model(
    model_id: str, body: ChangeModel, request: Request, client: ModelWriter
) -> dict[str, Any]:
    """Change a model's sampling defaults (responses created from now on use them)."""
    return await models.change_defaults(service(request), model_id, body.defaults.given())


@router.post("/{model_id:path}/verify")
async def verify_model(model_id: str, request: Request, client: ModelWriter) -> dict[str, Any]:
    """Recompute the model's full digest; ``status`` becomes ``ready`` or ``corrupt``."""
    return await models.verify(service(request), model_id)


@router.delete("/{model_id:path}")
async def delete_model(model_id: str, request: Request, client: ModelWriter) -> dict[str, Any]:
    await models.delete(service(request), client, model_id)
    return deleted(model_id, "model")
