"""``/v1/responses``: create (background, sync, stream), retrieve, cancel, delete."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lmsp import errors
from lmsp.api import direct
from lmsp.api.auth import require
from lmsp.api.params import Includes, ItemsQuery, ReplayQuery
from lmsp.api.routes.deps import delete_route, finished, idempotency_key, service
from lmsp.api.schemas import INCLUDABLE, CreateResponse, ReadTools, check_response
from lmsp.api.sse import as_stored
from lmsp.api.streams import followed
from lmsp.app import responses, tasks, turns
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
    core = service(request)
    return followed(
        core,
        tasks.Departure(core, task_id, cancel_on_disconnect, forget),
        as_stored,
        client=client,
        start=after,
        hide=ev.hidden_in_stream(include),
        headers=headers,
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
    obj = await finished(request, created.task_id, forget)
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
    replay: ReplayQuery,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
    include_obfuscation: bool = False,
) -> Response:
    core = service(request)
    found = await responses.find(core, response_id, client)
    _include(include)
    if include_obfuscation:
        raise unsupported("include_obfuscation", "Streams are not obfuscated here.")
    if replay.stream:
        return _stream(
            request,
            found.task_id,
            replay.after,
            include=include,
            cancel_on_disconnect=False,
            client=client,
        )
    return JSONResponse(await responses.current(core, found.task_id))


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str, request: Request, client: Reader, page: ItemsQuery
) -> dict[str, Any]:
    """The items the model was given (a conversation's earlier turns first), as a page."""
    core = service(request)
    found = await responses.find(core, response_id, client)
    for value in _include(page.include):
        if value != "message.input_image.image_url":  # no images are ever stored
            raise unsupported("include", f"include {value!r} does not apply to input items.")
    return await responses.input_items(core, found, page.order, page.after, page.limit)


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, client: Writer) -> Response:
    core = service(request)
    found = await responses.find(core, response_id, client)
    key = await idempotency_key(request, client)
    obj, replayed = await responses.cancel(core, found, key)
    return JSONResponse(obj, headers=REPLAYED if replayed else None)


delete_route(router, "delete_response", "response_id", responses.delete, "response")

#: ``POST /v1/responses`` answered below the router (:mod:`lmsp.api.direct`)
DIRECT = direct.Route("/v1/responses", create_response, CreateResponse, "responses:write")
