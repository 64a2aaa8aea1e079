"""The app factory: the lifespan (the running service opened, started and stopped by
:mod:`lmsp.app.root`), the HTTP face's own state (:mod:`lmsp.api.state`), error shapes
and the request body limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lmsp import __version__, errors, logs
from lmsp.api import direct, inputs, leaving, websocket
from lmsp.api.crosssite import CrossSiteGate
from lmsp.api.errors import anthropic_response, error_response, is_messages
from lmsp.api.errors import body as error_body
from lmsp.api.hosts import HostPolicy, RequestGate
from lmsp.api.refusals import refusal
from lmsp.api.routes import (
    activity,
    aliases,
    chat,
    completions,
    console,
    embeddings,
    fairshare,
    messages,
    meta,
    models,
    pairing,
    pulls,
    responses,
    tasks,
    webhook_endpoints,
)
from lmsp.api.routes import clients as client_routes
from lmsp.api.routes import compaction as compaction_routes
from lmsp.api.routes import conversations as conversation_routes
from lmsp.api.routes import webhooks as webhook_routes
from lmsp.api.routes.deps import idempotency_supported
from lmsp.api.sockets import Sockets
from lmsp.api.state import Http
from lmsp.api.tokens import TokenCache
from lmsp.api.validation import validation_problem
from lmsp.app import clients, root
from lmsp.app.service import Service
from lmsp.cluster.startup import HeadStart
from lmsp.config import Settings
from lmsp.datadir import DataDirLock

log = logging.getLogger("lmsp")


class BodyGate:
    """Answer ``413`` to a request body over ``limit`` bytes before any handler runs, and
    read every body as JSON (the only type this API takes), whatever ``Content-Type``
    a hand-written ``curl -d`` sent."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = errors.LmspError(
            "request_too_large", f"The request body exceeds {self.limit} bytes."
        )
        path = str(scope.get("path", ""))
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await error_response(too_large, path)(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await error_response(too_large, path)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem, value = _parsed(body)
        if problem is not None:
            await error_response(problem, path)(scope, receive, send)
            return
        delivered = False
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        if value is not _UNREAD:
            scope[direct.PARSED] = value  # a direct route does not parse it again

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class HttpMetrics:
    """Give every request an id (``X-Request-Id``: the caller's if it is a plain token
    of up to 64 characters, else a new one), which every log line written for it
    carries, and count every answer by route template (never the raw path: ids would
    make a label per object), method and status, with its latency (a stream's, until it
    ends). The outermost layer, so a ``413`` of :class:`BodyGate` is counted too; the
    route is noted by :func:`note_route` once routing found it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        answered: float | None = None  # a WebSocket's upgrade: accepted or refused then
        status = 500
        noted: dict[str, str] = {}
        scope[direct.ROUTE_KEY] = noted  # shared by the copies of ``scope`` made further in
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(8)
        token = logs.request_id.set(rid)
        refused: dict[str, str | None] = {}  # filled when an error answer is made
        refused_token = logs.refusal.set(refused)

        async def sending(message: Message) -> None:
            nonlocal status, answered
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status = int(message["status"])
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode())]
                message = dict(message, headers=headers)
            elif message["type"] == "websocket.close" and answered is None:
                status = 403  # closed before it was accepted (no such route)
            elif message["type"] == "websocket.accept":
                status = 101
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode())]
                message = dict(message, headers=headers)
            if answered is None and scope["type"] == "websocket":
                answered = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            logs.request_id.reset(token)
            logs.refusal.reset(refused_token)
            svc = getattr(scope["app"].state, "lmsp", None)
            kept = getattr(scope["app"].state, "http", None)
            if kept is not None and status >= 400:  # for ``lmsp logs --errors``
                refused["request_id"] = rid
                kept.refusals.add(refusal(scope, status, refused, refused.get("client_id")))
            if svc is not None:
                route = noted.get("route") or ("unmatched" if status == 404 else "other")
                ended = answered or time.perf_counter()  # a socket's life is not a latency
                svc.metrics.http(scope.get("method", "GET"), route, status, ended - began)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


async def note_route(request: Request) -> None:
    """An app-wide dependency: tell :class:`HttpMetrics` which route answers."""
    route = request.scope.get("route")
    noted = request.scope.get(direct.ROUTE_KEY)
    if noted is not None and route is not None:
        noted["route"] = str(getattr(route, "path", "other"))


_UNREAD = object()


def _parsed(body: bytes) -> tuple[errors.LmspError | None, Any]:
    """The body's JSON value (``_UNREAD`` when it is empty or not JSON: the route says
    so, with its own message), or the problem of JSON that parses but cannot be stored
    or sent back: text with lone surrogates, or nesting deeper than the parser goes."""
    if not body.strip():
        return None, _UNREAD
    try:
        value = json.loads(body)
    except RecursionError:
        return _too_deep(), _UNREAD
    except ValueError:
        return None, _UNREAD
    try:
        inputs.refuse_lone_surrogates(value)
    except errors.LmspError as exc:
        return exc, _UNREAD
    except RecursionError:
        return _too_deep(), _UNREAD
    return None, value


def _too_deep() -> errors.LmspError:
    return errors.invalid("The JSON body is nested too deeply.", code="invalid_json")


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_problem(list(exc.errors())), request.url.path)


async def _lmsp_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.LmspError)
    return error_response(exc, request.url.path)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = exc.detail if isinstance(exc.detail, str) else "Request failed."
    if exc.status_code == 404:
        message = f"No route {request.url.path!r}."
    err = errors.LmspError(codes.get(exc.status_code, "http_error"), message)
    if is_messages(request.url.path):
        return anthropic_response(err, exc.status_code)
    return JSONResponse(error_body(err, exc.status_code), exc.status_code)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left before its answer (:mod:`lmsp.api.leaving`): nobody reads this."""
    return Response(status_code=leaving.CLIENT_CLOSED)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    failure = errors.LmspError("internal_error", "Internal server error.")
    return error_response(failure, request.url.path)


#: the app's exception handlers, but for the last resort's (an unexpected error)
_HANDLERS: dict[Any, Any] = {
    errors.LmspError: _lmsp_error,
    RequestValidationError: _validation_error,
    HTTPException: _http_error,
    leaving.ClientGone: _client_gone,
}

#: the create routes :class:`lmsp.api.direct.Direct` answers below the router
DIRECT_ROUTES = [responses.DIRECT, chat.DIRECT, completions.DIRECT, messages.DIRECT]


def _announce_console(svc: Service, kept: Http) -> None:
    """The serve banner's one-time login link to the console, for the owner."""
    owner = clients.owner(svc)
    if owner is None:
        return
    code, _ = kept.console.new_link(owner)
    log.info(
        "console: %s (a one-time link for the owner; `lmsp console` prints another)",
        console.login_url(console.console_origin(svc.settings), code),
        extra={"event": "console.login_link"},
    )


def create_app(
    settings: Settings,
    lock: DataDirLock | None = None,
    head: HeadStart | None = None,
    *,
    fast: bool = True,
) -> FastAPI:
    """Build the ASGI app. Startup takes the data directory's lock (``lock``, when the
    caller took it already), opens the directory and recovers before serving; ``head``:
    the directory opened and engines launched already (:mod:`lmsp.cluster.startup`);
    ``fast=False``: the create routes through the framework's router too (the tests
    compare the two ways)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = await asyncio.to_thread(root.open_service, settings, lock, head)
        await root.start(svc)
        kept = Http(TokenCache(svc.db))
        app.state.http = kept
        app.state.lmsp = svc
        _announce_console(svc, kept)
        gc = asyncio.create_task(root.sweep_forever(svc))
        svc.metrics.add_collector(sockets.figures)
        try:
            yield
        finally:
            gc.cancel()
            await root.stop(svc)

    app = FastAPI(
        title="lmsp",
        version=__version__,
        summary="A local model service for AI agents whose work is durable.",
        lifespan=lifespan,
        dependencies=[Depends(note_route), Depends(idempotency_supported)],
    )
    for kind, handler in _HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(meta.router)
    app.include_router(activity.router)
    app.include_router(console.router)
    app.include_router(models.router)
    app.include_router(responses.router)
    app.include_router(chat.router)
    app.include_router(messages.router)
    app.include_router(completions.router)
    app.include_router(embeddings.router)
    app.include_router(tasks.router)
    app.include_router(pairing.router)
    app.include_router(client_routes.router)
    app.include_router(fairshare.router)
    app.include_router(pulls.router)
    app.include_router(webhook_routes.router)
    app.include_router(webhook_endpoints.router)
    app.include_router(webhook_endpoints.types_router)
    app.include_router(compaction_routes.router)
    app.include_router(conversation_routes.router)
    app.include_router(aliases.router)
    # ``GET /v1/responses`` upgraded to a WebSocket (its own checks: lmsp.api.websocket)
    app.router.routes.extend(websocket.routes())
    sockets = app.state.lmsp_sockets = Sockets(settings.ws_per_client)
    if fast:  # the create routes answered without the router (lmsp.api.direct)
        app.add_middleware(direct.Direct, routes=DIRECT_ROUTES, handlers=_HANDLERS)
    app.add_middleware(BodyGate, limit=settings.max_body_bytes)
    app.add_middleware(CrossSiteGate)  # before BodyGate reads every body as JSON
    app.add_middleware(
        RequestGate,
        hosts=HostPolicy(settings.host, settings.allowed_hosts),
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
    )
    app.add_middleware(HttpMetrics)
    return app


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
