"""Small helpers the route modules share."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from fastapi import APIRouter, Depends, Path, Request

from lmsp import errors
from lmsp.api import leaving
from lmsp.api.auth import require
from lmsp.api.state import service
from lmsp.app import responses, tasks
from lmsp.app.service import Service
from lmsp.protocol import chat
from lmsp.protocol.request import CreateRequest
from lmsp.store import idempotency
from lmsp.store.clients import Client

__all__ = [
    "IDEMPOTENT_ROUTES",
    "answered",
    "delete_route",
    "deleted",
    "finished",
    "finished_chat",
    "idempotency_key",
    "idempotency_supported",
    "service",
    "translated_request",
]

# the POST routes that honour ``Idempotency-Key`` (PROTOCOL.md section 7); any other POST
# carrying one is refused rather than silently run twice on a retry
IDEMPOTENT_ROUTES = frozenset(
    {
        "/v1/responses",
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/completions",
        "/v1/responses/{response_id}/cancel",
        "/v1/tasks/{task_id}/cancel",
        "/v1/models/pull",
    }
)


async def idempotency_supported(request: Request) -> None:
    """An app-wide dependency: refuse ``Idempotency-Key`` on a POST that cannot honour it."""
    if request.method != "POST" or "idempotency-key" not in request.headers:
        return
    route = request.scope.get("route")
    if getattr(route, "path", None) not in IDEMPOTENT_ROUTES:
        raise errors.LmspError(
            "unsupported_parameter",
            "This operation does not take an Idempotency-Key (only creating responses, chat"
            " completions, messages and completions and cancelling responses and tasks do);"
            " send it without one.",
            param="Idempotency-Key",
        )


def deleted(ident: str, kind: str) -> dict[str, Any]:
    """The answer to a delete: the object's id, its ``object`` name, ``deleted: true``."""
    return {"id": ident, "object": kind, "deleted": True}


#: a use case deleting an object a client may change: (the service, its id, the client)
Remove = Callable[[Service, str, Client], Awaitable[None]]


def delete_route(
    router: APIRouter, name: str, id_name: str, remove: Remove, kind: str, doc: str | None = None
) -> None:
    """Add ``DELETE /{id_name}`` to ``router`` (its function ``name``, described by
    ``doc``): ``remove`` as a client holding ``responses:write`` asks, then the answer to
    a delete (:func:`deleted`, ``object`` ``kind``)."""

    # defaults, not ``Annotated``: a string annotation could not see ``id_name``
    in_path = Path(alias=id_name)
    writer = Depends(require("responses:write"))

    async def route(
        request: Request, ident: str = in_path, client: Client = writer
    ) -> dict[str, Any]:
        await remove(service(request), ident, client)
        return deleted(ident, kind)

    route.__doc__ = doc
    router.add_api_route(f"/{{{id_name}}}", route, methods=["DELETE"], name=name)


async def answered(request: Request, task_id: str, forget: tuple[str, str] | None = None) -> None:
    """Wait for the end of a task its client waits for (not ``background``, not
    streamed). A client that leaves first cancels it (:mod:`lmsp.api.leaving`), and a
    ``store: false`` response (``forget``: its id and its client's) goes once it has
    stopped; :class:`lmsp.api.leaving.ClientGone` is raised then."""
    core = service(request)
    try:
        await leaving.unless_gone(tasks.wait_finished(core, task_id), request)
    except leaving.ClientGone:
        tasks.Departure(core, task_id, forget=forget).left()  # as a stream's departure does
        raise


async def finished(
    request: Request, task_id: str, forget: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The response object of a task its client waits for, once it has ended
    (:func:`answered`); a ``store: false`` one (``forget``) is forgotten then."""
    await answered(request, task_id, forget)
    core = service(request)
    obj = await core.read(core.response_object, task_id)
    if forget is not None:
        await responses.forget(core, *forget)
    return obj


async def finished_chat(
    request: Request, task_id: str, forget: tuple[str, str] | None = None
) -> dict[str, Any]:
    """:func:`finished` for the chat-shaped dialects (chat and legacy completions),
    which answer a failed or cancelled response with its error."""
    obj = await finished(request, task_id, forget)
    if obj["status"] in ("failed", "cancelled"):
        problem = chat.error_of(obj)
        raise errors.LmspError(problem["code"], problem["message"])
    return obj


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
    try:
        body: Any = json.loads(raw) if raw.strip() else None
    except (ValueError, RecursionError):
        raise errors.invalid("The body is not valid JSON.", code="invalid_json") from None
    digest = idempotency.request_digest(request.method, request.url.path, body)
    return idempotency.Key(client.id, raw_key, digest, service(request).settings.idempotency_ttl)


def translated_request(
    given: dict[str, Any],
    seed: int | None,
    on_restart: str | None,
    default_on_restart: str,
    **typed_fields: Any,
) -> CreateRequest:
    """The Responses create a dialect's body is: the fields it gave (``None`` dropped),
    a seed drawn now when it gave none (so a retried or resumed task samples the same
    way), and its ``on_restart`` policy or the service's; ``typed_fields``: the ones
    already typed (its checked input items, its tools)."""
    fields = {name: value for name, value in given.items() if value is not None}
    fields["seed"] = seed if seed is not None else secrets.randbits(31)
    fields["on_restart"] = on_restart or default_on_restart
    create = msgspec.convert(fields, CreateRequest)
    return msgspec.structs.replace(create, **typed_fields)
