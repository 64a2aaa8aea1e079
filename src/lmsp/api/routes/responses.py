"""``/v1/responses``: create (background, sync, stream), retrieve, cancel, delete."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from lmsp import errors
from lmsp.protocol.states import Status
from lmsp.store import idempotency, models
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.tasks.runner import messages_of

from ..auth import require
from ..schemas import CreateResponse
from ..sse import event_response, task_events
from .deps import idempotency_key, service

router = APIRouter(prefix="/v1/responses", tags=["responses"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]
REPLAYED = {"Idempotent-Replayed": "true"}


def _stream(
    request: Request,
    task_id: str,
    after: int,
    cancel_on_disconnect: bool,
    headers: dict[str, str] | None = None,
) -> Response:
    svc = service(request)
    assert svc.broker is not None
    on_disconnect = (lambda: svc.cancel_nowait(task_id)) if cancel_on_disconnect else None
    return event_response(
        task_events(svc.db, svc.broker, task_id, after),
        on_disconnect=on_disconnect,
        headers=headers,
        ping=svc.settings.sse_ping,
    )


def _model_not_found(model: str) -> errors.LmspError:
    return errors.LmspError(
        "model_not_found", f"The model {model!r} does not exist.", param="model"
    )


@router.post("", status_code=200, responses={202: {"description": "Accepted (background)"}})
async def create_response(body: CreateResponse, request: Request, client: Writer) -> Response:
    svc = service(request)
    if body.background and not body.store:
        raise errors.invalid("A background response must be stored (store: true).", "store")
    record = models.get(svc.db.reader(), body.model)
    if record is None:
        raise _model_not_found(body.model)
    key = await idempotency_key(request, client)
    stored: dict[str, Any] = body.model_dump(exclude_none=True)
    stored["seed"] = body.seed if body.seed is not None else secrets.randbits(31)
    on_restart = body.on_restart or svc.settings.default_on_restart
    stored["on_restart"] = on_restart
    # a prompt the context cannot hold is refused now, when its length can be known
    size = await asyncio.to_thread(svc.host.prompt_size, record, messages_of(stored))
    if size is not None and size[0] >= size[1]:
        raise errors.LmspError(
            "context_length_exceeded",
            f"The prompt has {size[0]} tokens; the context of {body.model!r} holds {size[1]}.",
            param="input",
        )

    def job(conn: sqlite3.Connection) -> response_store.Created:
        if models.get(conn, body.model) is None:  # deleted meanwhile
            raise _model_not_found(body.model)
        return response_store.create(
            conn,
            client_id=client.id,
            request=stored,
            on_restart=on_restart,
            max_queue=svc.settings.max_queue,
            key=key,
        )

    created = await svc.db.write(job)
    headers = dict(REPLAYED) if created.replayed else {}
    if created.replayed:
        task = task_store.get(svc.db.reader(), created.task_id)
        unfinished = task is not None and not Status(task["status"]).terminal
        if created.status_code != 202 and unfinished:
            raise errors.LmspError(
                "idempotency_request_in_progress",
                "A request with this Idempotency-Key is still being processed.",
            )
    else:
        svc.runner.notify()
    if body.stream:
        return _stream(request, created.task_id, -1, not body.background, headers)
    if body.background:
        headers["Location"] = f"/v1/responses/{created.response_id}"
        # the object as committed: a worker may claim the task before a re-read
        obj = created.response or svc.response_object(created.task_id)
        return JSONResponse(obj, 202, headers=headers)
    await svc.wait_finished(created.task_id)
    obj = svc.response_object(created.task_id)
    if not body.store:
        await svc.db.write(lambda c: response_store.delete(c, created.response_id, client.id))
    return JSONResponse(obj, 200, headers=headers)


@router.get("/{response_id}")
async def retrieve_response(
    response_id: str,
    request: Request,
    client: Reader,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1)] = -1,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    svc = service(request)
    _, task = svc.owned_response(response_id, client)
    if stream:
        after = starting_after
        if last_event_id is not None and last_event_id.strip().lstrip("-").isdigit():
            after = max(after, int(last_event_id))
        return _stream(request, task["id"], after, cancel_on_disconnect=False)
    return JSONResponse(svc.response_object(task["id"]))


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, client: Writer) -> Response:
    svc = service(request)
    _, task = svc.owned_response(response_id, client)
    key = await idempotency_key(request, client)
    if key is not None:
        replay = await svc.db.write(lambda c: idempotency.remember(c, key, response_id))
        if replay:
            return JSONResponse(svc.response_object(task["id"]), headers=REPLAYED)
    await svc.cancel(task["id"])
    return JSONResponse(svc.response_object(task["id"]))


@router.delete("/{response_id}")
async def delete_response(response_id: str, request: Request, client: Writer) -> Response:
    svc = service(request)
    svc.owned_response(response_id, client)
    outcome = await svc.db.write(lambda c: response_store.delete(c, response_id, client.id))
    if outcome == "missing":
        raise errors.not_found("response", response_id)
    if outcome == "conflict":
        raise errors.LmspError(
            "response_in_progress", "The response is unfinished; cancel it first."
        )
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
