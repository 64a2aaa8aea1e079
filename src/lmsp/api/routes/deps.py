"""Small helpers the route modules share."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from lmsp import errors
from lmsp.store import idempotency
from lmsp.store.clients import Client

from ..service import Service


def service(request: Request) -> Service:
    svc: Service = request.app.state.lmsp
    return svc


async def idempotency_key(request: Request, client: Client) -> idempotency.Key | None:
    """The request's ``Idempotency-Key`` with the digest of method, path and body."""
    raw_key = request.headers.get("idempotency-key")
    if raw_key is None:
        return None
    if not idempotency.valid_key(raw_key):
        raise errors.invalid(
            "Idempotency-Key must be 1 to 255 visible ASCII characters.",
            param="Idempotency-Key",
            code="invalid_idempotency_key",
        )
    raw = await request.body()
    body: Any = json.loads(raw) if raw.strip() else None
    digest = idempotency.request_digest(request.method, request.url.path, body)
    return idempotency.Key(client.id, raw_key, digest, service(request).settings.idempotency_ttl)
