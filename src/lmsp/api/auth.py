"""Bearer-token authentication and scope checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from lmsp import errors
from lmsp.store import clients
from lmsp.store.clients import Client


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require(scope: str) -> Callable[[Request], Awaitable[Client]]:
    """A dependency: the calling client, which must hold ``scope``."""

    async def dependency(request: Request) -> Client:
        token = bearer(request)
        if token is None:
            raise errors.unauthorized()
        client = clients.authenticate(request.app.state.lmsp.db.reader(), token)
        if client is None:
            raise errors.unauthorized()
        if not client.allows(scope):
            raise errors.forbidden(scope)
        return client

    return dependency
