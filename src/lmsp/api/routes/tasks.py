"""``/v1/tasks``: list, get, the event log (SSE or JSON pages), cancel
(:mod:`lmsp.app.tasks`).

A client sees its own tasks; ``admin`` (the owner) sees and cancels every client's, and
the task objects it gets name their ``client_id``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from lmsp.api import inputs
from lmsp.api.auth import require
from lmsp.api.routes.deps import idempotency_key, service
from lmsp.api.sse import as_stored
from lmsp.api.streams import followed
from lmsp.app import tasks
from lmsp.protocol.states import Status
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]


@router.get("")
async def list_tasks(
    request: Request,
    client: Reader,
    status: Status | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    client_id: Annotated[
        str | None,
        Query(max_length=64, description="Only this client's tasks (admin: any client)."),
    ] = None,
) -> dict[str, Any]:
    """A client's own tasks, newest first; ``admin`` lists every client's."""
    listing = tasks.Listing(status, limit, after, client_id)
    return await tasks.page(service(request), client, listing)


@router.get("/{task_id}")
async def get_task(task_id: str, request: Request, client: Reader) -> dict[str, Any]:
    return await tasks.show(service(request), task_id, client)


@router.get("/{task_id}/events")
async def task_event_log(
    task_id: str,
    request: Request,
    client: Reader,
    after: Annotated[int, Query(ge=-1, le=inputs.MAX_SEQUENCE)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Without ``after`` the log starts at 0. ``Accept: application/json`` gives a page."""
    core = service(request)
    await tasks.find(core, task_id, client)
    after = inputs.resume_after(after, last_event_id)
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse(await tasks.events_page(core, task_id, after, limit))
    stays = tasks.Departure(core, task_id, cancel=False)  # a follower only
    return followed(core, stays, as_stored, client=client, start=after, done=False)


@router.post("/{task_id}/cancel")
async def cancel_task(task_id: str, request: Request, client: Writer) -> dict[str, Any]:
    core = service(request)
    await tasks.find(core, task_id, client)
    key = await idempotency_key(request, client)
    return await tasks.cancel_owned(core, task_id, client, key)
