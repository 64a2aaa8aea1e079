"""``POST /v1/models/pull``: a model by name from the hub, as a durable task (PROTOCOL.md
section 12).

The reference is checked against the hub before anything is written (a missing
repository or quantization is a ``400`` now, not a failed task later), the disk must
have room for the files not in the blob store yet (``507``), and then the pull's task is
committed and handed to the downloader (:mod:`lmsp.outbound.pull`). Pulling the same
reference again while its pull is unfinished answers that pull's task: the same pull
goes on, never a second one.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp import errors
from lmsp.api.auth import require
from lmsp.api.routes.deps import idempotency_key, service
from lmsp.api.routes.models import ModelId
from lmsp.datadir import ensure_private_dir
from lmsp.outbound.hub import Hub, parse_reference
from lmsp.protocol import objects
from lmsp.store import audit, blobs, models, pulls
from lmsp.store import tasks as task_store
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
    svc = service(request)
    downloader = svc.runner.pulls
    assert downloader is not None
    ref = parse_reference(body.source)
    model_id = body.id or ref.default_id
    if len(model_id) > 128:
        raise errors.invalid("The default id is too long: name one with `id`.", "id")
    node = svc.settings.node if svc.db.shared else ""
    key = await idempotency_key(request, client)

    def joined() -> dict[str, Any] | None:
        conn = svc.db.reader()
        task = pulls.unfinished(conn, ref.canonical, model_id, node)
        if task is None:
            return None
        if not client.oversees(task["client_id"]):
            raise errors.LmspError(
                "conflict", f"Another client is pulling {model_id!r}.", param="id"
            )
        return objects.render_task(task, task_store.queue_position(conn, task))

    running = await svc.read(joined)
    if running is not None:  # the same pull goes on
        return _answer(running, model_id, 202)
    if await svc.read(lambda: models.get(svc.db.reader(), model_id)) is not None:
        raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    if await svc.read(lambda: pulls.any_unfinished_into(svc.db.reader(), model_id, node)):
        raise errors.LmspError(
            "conflict", f"Another pull into {model_id!r} is unfinished.", param="id"
        )

    def resolve() -> tuple[str, list[pulls.HubFile]]:
        with Hub(downloader.endpoint, svc.settings.hf_token) as hub:
            return hub.resolve(ref)

    revision, files = await asyncio.to_thread(resolve)
    needed = sum(
        f.size for f in files if not blobs.blob_path(svc.settings.blobs_dir, f.digest).is_file()
    )
    ensure_private_dir(svc.settings.blobs_dir)
    free = shutil.disk_usage(svc.settings.blobs_dir).free
    if free < needed:
        raise errors.LmspError(
            "insufficient_storage",
            f"The model needs {needed} bytes; the data directory's disk has {free} free.",
        )

    def job(conn: Any) -> tuple[Any, bool]:
        made = pulls.create(
            conn,
            client_id=client.id,
            ref=ref.canonical,
            model_id=model_id,
            node=node,
            repo=ref.repo,
            revision=revision,
            quant=ref.quant,
            files=files,
            max_queue=svc.settings.max_queue,
            key=key,
        )
        if not made[1] and not made[0].replayed:  # a new pull, not the same one again
            audit.record(conn, client.id, "model.pulled", model_id, {"from": ref.canonical})
        return made

    created, again = await svc.db.write(job)
    svc.runner.notify()
    downloader.notify()
    task = await svc.read(lambda: task_store.get(svc.db.reader(), created.task_id))
    assert task is not None
    obj = await svc.read(
        lambda: objects.render_task(task, task_store.queue_position(svc.db.reader(), task))
    )
    headers = {"Idempotent-Replayed": "true"} if again and key is not None else {}
    return _answer(obj, model_id, 202, headers)


def _answer(
    task: dict[str, Any], model_id: str, status: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"object": "model.pull", "task": task, "model": model_id}
    location = {"Location": f"/v1/tasks/{task['id']}"}
    return JSONResponse(body, status, headers={**location, **(headers or {})})
