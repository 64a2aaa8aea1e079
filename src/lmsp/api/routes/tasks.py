"""``/v1/tasks``: list, get, the event log (SSE or JSON pages), cancel.

A client sees its own tasks; ``admin`` (the owner) sees and cancels every client's, and
the task objects it gets name their ``client_id``."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from lmsp import errors
from lmsp.api import inputs
from lmsp.api.auth import require
from lmsp.api.revocation import until_revoked
from lmsp.api.routes.deps import idempotency_key, service
from lmsp.api.sse import event_response, framed, task_events
from lmsp.app.service import Service
from lmsp.protocol import objects
from lmsp.protocol.states import Status
from lmsp.store import events, idempotency
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]


def render(conn: Conn, task: Row, client: Client, *, nodes: bool = False) -> dict[str, Any]:
    """The task object; an admin (who sees every client's tasks) also gets its owner.
    ``node``: the node holding (or that last held) the task when nodes share the
    database (``nodes``), ``null`` on a single machine (PROTOCOL.md section 5)."""
    obj = objects.render_task(task, task_store.queue_position(conn, task))
    obj["node"] = task["node_id"] if nodes else None
    if client.admin:
        obj["client_id"] = task["client_id"]
    return obj


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
    svc = service(request)
    if client_id is not None and not client.oversees(client_id):
        raise errors.forbidden("admin")
    return await svc.read(_list_page, svc, client, status, limit, after, client_id)


def _list_page(
    svc: Service,
    client: Client,
    status: Status | None,
    limit: int,
    after: str | None,
    client_id: str | None,
) -> dict[str, Any]:
    """One page of the task list (in a reader thread)."""
    conn = svc.db.reader()
    before: int | None = None
    if after is not None:
        cursor = task_store.get(conn, after)
        if cursor is None or not client.oversees(cursor["client_id"]):
            raise errors.invalid(f"Unknown cursor {after!r}.", param="after")
        before = int(cursor["seq"])
    owner = client_id or client.id if client_id is not None or not client.admin else None
    rows = task_store.page(conn, owner, status.value if status else None, before, limit + 1)
    page = rows[:limit]
    data = [render(conn, t, client, nodes=svc.membership is not None) for t in page]
    return objects.list_page(data, len(rows) > limit)


@router.get("/{task_id}")
async def get_task(task_id: str, request: Request, client: Reader) -> dict[str, Any]:
    svc = service(request)

    def page() -> dict[str, Any]:
        task = svc.owned_task(task_id, client)
        return render(svc.db.reader(), task, client, nodes=svc.membership is not None)

    return await svc.read(page)


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
    svc = service(request)
    await svc.read(svc.owned_task, task_id, client)
    after = inputs.resume_after(after, last_event_id)
    if "application/json" in request.headers.get("accept", ""):
        rows = await svc.read(lambda: events.after(svc.db.reader(), task_id, after, limit + 1))
        return JSONResponse(
            {
                "object": "list",
                "data": [json.loads(data) for _, _, data in rows[:limit]],
                "has_more": len(rows) > limit,
            }
        )
    assert svc.broker is not None
    source = framed(task_events(svc.db, svc.broker, task_id, after))
    return event_response(
        until_revoked(source, svc.db, svc.broker, client.id), ping=svc.settings.sse_ping
    )


@router.post("/{task_id}/cancel")
async def cancel_task(task_id: str, request: Request, client: Writer) -> dict[str, Any]:
    svc = service(request)
    await svc.read(svc.owned_task, task_id, client)
    key = await idempotency_key(request, client)
    if key is None or not await svc.db.write(lambda c: idempotency.remember(c, key, task_id)):
        await svc.cancel(task_id, wait=svc.settings.cancel_wait)

    def page() -> dict[str, Any]:
        task = svc.owned_task(task_id, client)
        return render(svc.db.reader(), task, client, nodes=svc.membership is not None)

    return await svc.read(page)
