"""The create routes answered below the framework's routing and dependency solving.

``POST /v1/responses``, ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/messages`` are what an agent sends most; through FastAPI each one crossed its
router's scan, the dependency solver (the security scheme's sub-dependency, a
``Response`` made per request, the body's validation) and an exception layer: more of
the event loop's time than the route's own work (docs/performance.md). :class:`Direct`,
the innermost of the app's middlewares, answers those four itself with the same
endpoint functions, in the order FastAPI would: a body that is not JSON first, then the
client's token and scope (:func:`lmsp.api.auth.authorize`), then the body's schema
(pydantic's errors as FastAPI reports them, ``loc`` starting with ``"body"``); its
errors go to the app's own exception handlers. Every other request, and these paths
with another method, go on to the framework; the routes stay declared there as well
(the OpenAPI document, the walk of routes and scopes in the tests).
``tests/test_direct_routes.py`` sends the same requests, good and bad, to both ways.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lmsp.api.auth import authorize
from lmsp.store.clients import Client

#: where :class:`lmsp.api.app.BodyGate` leaves the body it parsed (the JSON value), so
#: that a direct route does not parse it again
PARSED = "lmsp.json"
#: where :class:`lmsp.api.app.HttpMetrics` takes the answering route's template
ROUTE_KEY = "lmsp.route"

Endpoint = Callable[[Any, Request, Client], Awaitable[Response]]
Handler = Callable[[Request, Exception], Any]


@dataclass(frozen=True)
class Route:
    """A create route: its path, its endpoint (``body, request, client``), its body's
    model, the scope its client must hold, and whether ``x-api-key`` may carry the token."""

    path: str
    endpoint: Endpoint
    body: type[BaseModel]
    scope: str
    api_key: bool = False


_NOTHING = object()
_MISSING = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}


class Direct:
    """Answer ``POST`` to the :class:`Route` paths without the router; pass on the rest."""

    def __init__(self, app: ASGIApp, routes: list[Route], handlers: Mapping[Any, Handler]) -> None:
        self.app = app
        self.routes = {route.path: route for route in routes}
        # the app's handlers for LmspError, validation errors, HTTPException and a client
        # that left (an unexpected error goes on to the outermost layer, as it does now)
        self.guarded = ExceptionMiddleware(self._answer, handlers=dict(handlers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.routes:
            await self.app(scope, receive, send)
            return
        await self.guarded(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes[scope["path"]]
        noted = scope.get(ROUTE_KEY)
        if noted is not None:
            noted["route"] = route.path
        request = Request(scope, receive, send)
        value = scope.get(PARSED, _NOTHING)
        if value is _NOTHING:  # not parsed by the body gate: empty, or not JSON
            value = await _json(request)
        client = await authorize(request, route.scope, api_key=route.api_key)
        if value is _NOTHING:
            raise RequestValidationError([_MISSING])
        try:
            body = route.body.model_validate(value, from_attributes=True)  # as FastAPI does
        except ValidationError as exc:
            raise RequestValidationError(
                [dict(e, loc=("body", *e["loc"])) for e in exc.errors()]
            ) from None
        response = await route.endpoint(body, request, client)
        await response(scope, receive, send)


async def _json(request: Request) -> Any:
    """The body's JSON value (``_NOTHING`` for an empty body), or the ``json_invalid``
    error FastAPI gives for a body that does not parse."""
    raw = await request.body()
    if not raw:
        return _NOTHING
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        problem = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error"}
        raise RequestValidationError([problem]) from None
    except ValueError:  # not UTF-8
        raise HTTPException(400, "There was an error parsing the body") from None
