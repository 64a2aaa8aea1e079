"""``/v1/responses``: create (background, sync, stream), retrieve, cancel, delete."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from lmsp import errors
from lmsp.api import inputs
from lmsp.api.auth import require
from lmsp.api.revocation import until_revoked
from lmsp.api.routes.deps import answered, idempotency_key, service
from lmsp.api.schemas import INCLUDABLE, CreateResponse, ReadTools, check_response
from lmsp.api.sse import event_response, framed, task_events
from lmsp.app import turns
from lmsp.app.service import Service
from lmsp.errors import unsupported
from lmsp.protocol import events as ev
from lmsp.protocol import mcp
from lmsp.protocol.request import CreateRequest
from lmsp.protocol.tools import typed_choice, typed_tools
from lmsp.store import idempotency
from lmsp.store import responses as response_store
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/responses", tags=["responses"])

Reader = Annotated[Client, Depends(require("responses:read"))]
Writer = Annotated[Client, Depends(require("responses:write"))]
REPLAYED = {"Idempotent-Replayed": "true"}


def _stream(
    request: Request,
    task_id: str,
    after: int,
    *,
    include: list[str] | None,
    cancel_on_disconnect: bool,
    forget: tuple[str, str] | None = None,
    headers: dict[str, str] | None = None,
    client: Client | None = None,
) -> Response:
    """A ``/v1/responses`` stream: standard event types (the LMSP lifecycle extensions
    only when ``include`` asks for them), then ``data: [DONE]``. ``forget``:
    ``(response id, client id)`` of a ``store: false`` response, deleted once finished."""
    svc = service(request)
    assert svc.broker is not None

    def on_disconnect() -> None:
        if cancel_on_disconnect:
            svc.cancel_nowait(task_id)
        if forget is not None:
            svc.forget_later(task_id, *forget)

    async def on_finish() -> None:
        if forget is not None:
            await svc.delete_when_finished(task_id, *forget)

    hide = ev.hidden_in_stream(include)
    source = framed(task_events(svc.db, svc.broker, task_id, after, hide=hide))
    if client is not None:  # a revoked client's stream ends
        source = until_revoked(source, svc.db, svc.broker, client.id, on_revoked=on_disconnect)
    return event_response(
        source,
        on_disconnect=on_disconnect,
        on_finish=on_finish,
        done=True,
        headers=headers,
        ping=svc.settings.sse_ping,
    )


def create_request(
    body: CreateResponse, read: ReadTools, turn: turns.Turn, on_restart: str
) -> CreateRequest:
    """The create a body asks for, parsed once: its fields as given (``None`` left out),
    its tools and ``tool_choice`` as :func:`check_response` read them (MCP header values
    taken out, kept apart), its conversation as ``{"id"}``, and the numbers it runs with
    (a seed drawn now when it gave none, so a retried or resumed task samples the same
    way)."""
    given = body.model_dump(exclude_none=True, by_alias=True, exclude=_READ_APART)
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    given["seed"] = body.seed if body.seed is not None else secrets.randbits(31)
    given["on_restart"] = body.on_restart or on_restart
    if turn.conversation is not None:
        given["conversation"] = {"id": turn.conversation}
    create = msgspec.convert(given, CreateRequest)
    headers = mcp.take_headers(read.tools or [])  # MCP header values: kept apart, never shown
    return msgspec.structs.replace(
        create,
        given=body.input,
        tools=None if read.tools is None else typed_tools(read.tools),
        tool_choice=typed_choice(read.choice),
        mcp_headers=headers,
    )


#: the fields :func:`create_request` takes from elsewhere than the body's dump
_READ_APART = {"input", "tools", "tool_choice", "conversation", "context_management"}


async def create_turn(
    svc: Service,
    body: CreateResponse,
    client: Client,
    key_of: Callable[[], Awaitable[idempotency.Key | None]],
    item_names: list[str] | None = None,
) -> response_store.Created:
    """Create the response ``body`` asks for, whichever transport it came by (this
    route, or a WebSocket's ``response.create``: :mod:`lmsp.api.websocket`); ``key_of``:
    its idempotency key, read once the body is known to be supported; ``item_names``:
    how errors name its input items (``input.3`` by default)."""
    read = check_response(body)
    turn = turns.read(body.conversation, body.context_management, body.previous_response_id)
    key = await key_of()
    given = create_request(body, read, turn, svc.settings.default_on_restart)
    mcp.check_hosts(given.tools or (), svc.settings.mcp_hosts)
    return await svc.create(
        client, given, key, compact_over=turn.compact_over, item_names=item_names
    )


@router.post("", status_code=200, responses={202: {"description": "Accepted (background)"}})
async def create_response(body: CreateResponse, request: Request, client: Writer) -> Response:
    svc = service(request)
    created = await create_turn(svc, body, client, lambda: idempotency_key(request, client))
    headers = dict(REPLAYED) if created.replayed else {}
    forget = None if body.store is not False else (created.response_id, client.id)
    if body.stream:
        return _stream(
            request,
            created.task_id,
            -1,
            include=body.include,
            cancel_on_disconnect=not body.background,
            forget=forget,
            headers=headers,
            client=client,
        )
    if body.background:
        headers["Location"] = f"/v1/responses/{created.response_id}"
        # the object as committed: a worker may claim the task before a re-read
        obj = created.response or await svc.read(svc.response_object, created.task_id)
        return JSONResponse(obj, 202, headers=headers)
    await answered(request, created.task_id, forget)
    obj = await svc.read(svc.response_object, created.task_id)
    if forget is not None:
        await svc.db.write(lambda c: response_store.delete(c, *forget))
    return JSONResponse(obj, 200, headers=headers)


def _include(values: list[str]) -> list[str]:
    for value in values:
        if value not in INCLUDABLE:
            raise errors.LmspError(
                "invalid_value", f"Unknown include value {value!r}.", param="include"
            )
    return values


@router.get("/{response_id}")
async def retrieve_response(
    response_id: str,
    request: Request,
    client: Reader,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1, le=inputs.MAX_SEQUENCE)] = -1,
    include: Annotated[list[str], Query(max_length=16)] = [],  # noqa: B006 (FastAPI copies)
    include_obfuscation: bool = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    svc = service(request)
    _, task = await svc.read(svc.owned_response, response_id, client)
    _include(include)
    if include_obfuscation:
        raise unsupported("include_obfuscation", "Streams are not obfuscated here.")
    if stream:
        after = inputs.resume_after(starting_after, last_event_id)
        return _stream(
            request, task["id"], after, include=include, cancel_on_disconnect=False, client=client
        )
    return JSONResponse(await svc.read(svc.response_object, task["id"]))


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    client: Reader,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    include: Annotated[list[str], Query(max_length=16)] = [],  # noqa: B006 (FastAPI copies)
) -> dict[str, Any]:
    """The items the model was given (a conversation's earlier turns first), as a page."""
    svc = service(request)
    response, _ = await svc.read(svc.owned_response, response_id, client)
    for value in _include(include):
        if value != "message.input_image.image_url":  # no images are ever stored
            raise unsupported("include", f"include {value!r} does not apply to input items.")
    # its history expanded (``409 history_deleted`` if a response of it was deleted); a
    # conversation's items are read a page at a time
    return await svc.read(
        lambda: response_store.input_items(svc.db.reader(), response, order, after, limit)
    )


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, client: Writer) -> Response:
    svc = service(request)
    _, task = svc.owned_response(response_id, client)
    key = await idempotency_key(request, client)
    if key is not None:
        replay = await svc.db.write(lambda c: idempotency.remember(c, key, response_id))
        if replay:
            return JSONResponse(svc.response_object(task["id"]), headers=REPLAYED)
    await svc.cancel(task["id"], wait=svc.settings.cancel_wait)
    return JSONResponse(svc.response_object(task["id"]))


@router.delete("/{response_id}")
async def delete_response(response_id: str, request: Request, client: Writer) -> Response:
    svc = service(request)
    response, _ = svc.owned_response(response_id, client)
    owner = response["client_id"]  # the owner's (an admin may delete any response)
    outcome = await svc.db.write(lambda c: response_store.delete(c, response_id, owner))
    if outcome == "missing":
        raise errors.not_found("response", response_id)
    if outcome == "conflict":
        raise errors.LmspError(
            "response_in_progress", "The response is unfinished; cancel it first."
        )
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
