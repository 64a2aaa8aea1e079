"""``/v1/model_aliases``: another name for a model (``lmsp models alias NAME MODEL``),
so that a client with a fixed model name works; and ``GET /v1/refusals`` (``admin``):
the recent refused requests with their client (``lmsp logs --errors``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, StringConstraints

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.api.state import http
from lmsp.app import models
from lmsp.store import aliases
from lmsp.store.clients import Client

router = APIRouter(tags=["models"])

ModelReader = Annotated[Client, Depends(require("models:read"))]
ModelWriter = Annotated[Client, Depends(require("models:write"))]
Admin = Annotated[Client, Depends(require("admin"))]

#: an alias is any name a client may send as ``model`` (OpenAI's and Anthropic's ids)
AliasName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")
]


class SetAlias(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]


def _render(alias: aliases.Alias) -> dict[str, Any]:
    return {
        "object": "model_alias",
        "alias": alias.alias,
        "model": alias.model,
        "created_at": alias.created_at,
    }


@router.get("/v1/model_aliases")
async def list_aliases(request: Request, client: ModelReader) -> dict[str, Any]:
    found = await models.all_aliases(service(request))
    return {"object": "list", "data": [_render(a) for a in found]}


@router.put("/v1/model_aliases/{alias:path}")
async def set_alias(
    alias: AliasName, body: SetAlias, request: Request, client: ModelWriter
) -> dict[str, Any]:
    """Point ``alias`` at a model (replacing what it named)."""
    return _render(await models.set_alias(service(request), alias, body.model))


@router.delete("/v1/model_aliases/{alias:path}")
async def delete_alias(alias: str, request: Request, client: ModelWriter) -> dict[str, Any]:
    await models.delete_alias(service(request), alias)
    return {"object": "model_alias", "alias": alias, "deleted": True}


@router.get("/v1/refusals")
async def recent_refusals(
    request: Request,
    client: Admin,
    limit: Annotated[int, Query(ge=1, le=256)] = 50,
    client_id: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The newest refused requests first (kept in memory: a restart empties them)."""
    return {"object": "list", "data": http(request).refusals.recent(limit, client_id)}
