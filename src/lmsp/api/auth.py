"""Bearer-token authentication and scope checks.

Tokens are checked against :class:`lmsp.api.tokens.TokenCache` (no database round trip
once a token is known; a revoke or a changed client takes effect at the next request).

:func:`require` declares its scope through FastAPI's ``Security``, so every route's
scope is written into the OpenAPI document (``security: [{"bearer": [scope]}]``) and
tests can walk the routes from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from lmsp import errors, logs
from lmsp.api import sessions
from lmsp.api.state import http, service
from lmsp.app import clients as client_uses
from lmsp.store import clients
from lmsp.store.clients import Client

scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A client token (`lmsp_…`); the route's scope is listed with it.",
)


#: the Messages API's header (Anthropic's SDKs and Claude Code with ANTHROPIC_API_KEY)
api_key_scheme = APIKeyHeader(
    name="x-api-key",
    auto_error=False,
    scheme_name="x-api-key",
    description="A client token (`lmsp_…`) in `x-api-key`: the Messages API takes it too.",
)


def bearer(request: HTTPConnection) -> str | None:
    header = request.headers.get("authorization", "")
    scheme_name, _, token = header.partition(" ")
    if scheme_name.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def console_client(request: HTTPConnection) -> Client | None:
    """The client a console session stands for (``None`` without a live session): the
    session's secret comes in its own header (:mod:`lmsp.api.sessions`), which no page
    of another origin holds and no browser adds by itself."""
    secret = request.headers.get(sessions.HEADER)
    if not secret:
        return None
    session = http(request).console.session(secret)
    if session is None:
        return None
    return client_uses.active(service(request), session.client_id)


def require(scope: str, *, api_key: bool = False) -> Callable[..., Awaitable[Client]]:
    """A dependency: the calling client, which must hold ``scope`` (or ``admin``).
    ``api_key``: the token may come in ``x-api-key`` too (the Messages API)."""
    if scope not in clients.SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    # a default, not ``Annotated``: a string annotation could not see ``scope``
    declared = Security(scheme, scopes=[scope])
    if api_key:
        key_declared = Security(api_key_scheme, scopes=[scope])

        async def either(
            request: Request,
            credentials: HTTPAuthorizationCredentials | None = declared,
            key: str | None = key_declared,
        ) -> Client:
            return await authorize(request, scope, api_key=True)

        return either

    async def dependency(
        request: Request, credentials: HTTPAuthorizationCredentials | None = declared
    ) -> Client:
        return await authorize(request, scope)

    return dependency


async def authorize(request: HTTPConnection, scope: str, *, api_key: bool = False) -> Client:
    """The calling client, which must hold ``scope`` (or ``admin``): else 401 / 403.
    ``request``: a request's or a WebSocket upgrade's (the same headers are read).

    A bearer token (with ``api_key``, else one in ``x-api-key``), or else a console
    session (its secret in ``X-Lmsp-Session``)."""
    token = bearer(request)
    if token is None and api_key:
        token = request.headers.get("x-api-key", "").strip() or None
    if token is None:
        client = console_client(request)
    else:
        # from the token cache (no database round trip), else read off the event loop
        client = await http(request).tokens.authenticate(token, service(request).read)
    if client is None:
        raise errors.unauthorized()
    logs.client_id.set(client.id)  # the request's log lines name their client
    if not client.allows(scope):
        raise errors.forbidden(scope)
    await client_uses.record_use(service(request), client)
    return client
