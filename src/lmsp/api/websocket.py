"""``GET /v1/responses`` upgraded to a WebSocket (Open Responses' WebSocket mode): a
transport over the same create and follow steps as the HTTP route.

**The upgrade** passes what an HTTP request passes: the ``Host`` check and head caps
(:class:`lmsp.api.hosts.RequestGate`), a bearer token with ``responses:write``, and no
browser page of another origin (``Origin``/``Sec-Fetch-Site``: a page may open a
socket to any address). A refusal is a real HTTP answer with section 8's body (``401``,
``403``, ``421``, ``429 too_many_websockets`` past ``LMSP_WS_PER_CLIENT`` sockets of
one client).

**A turn** is one ``{"type": "response.create", …create body…}`` text frame
(``stream``, ``stream_options`` and ``background`` refused, as the specification says,
and OpenAI's ``generate``/``stream_id``, which lmsp does not have). The response is
created exactly as ``POST /v1/responses`` creates it — committed, with its task, before
its first event — and its events go out one JSON text frame each, the very bytes of its
event log with their sequence numbers (no ``[DONE]``), up to its terminal event. A turn
refused or failed before it has a response gets one error envelope
``{"type": "error", "status": N, "error": {…}}`` instead. Either way the socket stays
open for the next turn; turns run one after another (a frame sent during a turn waits
for it). ``metadata.idempotency_key`` is a turn's idempotency key (as the header is a
POST's): a replayed turn streams the first one's events.

**What survives what.** A ``store: true`` turn is a task like any other: a socket that
drops (or does not read: ``LMSP_WS_SEND_TIMEOUT``) leaves it running, as a background
response, and a restart recovers it per its ``on_restart``; its events stay readable
(``GET /v1/responses/{id}?stream=true&starting_after=N``) and a new socket continues
it by ``previous_response_id``. A ``store: false`` turn is deleted once finished, as over
HTTP, and cancelled when its socket drops (no one could ever read it); what a next turn
on the same socket needs to continue it is kept in the socket's memory
(:mod:`lmsp.api.wscache`).

**Limits.** A socket idle (no turn, no frame) for ``LMSP_WS_IDLE_TIMEOUT`` or open for
``LMSP_WS_MAX_AGE`` gets a ``websocket_connection_limit_reached`` envelope (between
turns) and is closed; a frame over ``LMSP_MAX_BODY_BYTES`` closes it (1009, uvicorn's
``ws_max_size``); events are sent only as fast as the client reads them (the server holds
one frame and the transport's buffer, never a backlog: the log is on disk).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from sse_starlette import ServerSentEvent
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from lmsp import errors
from lmsp.api import inputs, wscache
from lmsp.api.auth import authorize
from lmsp.api.crosssite import cross_site
from lmsp.api.errors import body as error_body
from lmsp.api.errors import error_response, status_of
from lmsp.api.revocation import until_revoked
from lmsp.api.routes.responses import create_turn
from lmsp.api.schemas import CreateResponse
from lmsp.api.sockets import OpenSocket, Sockets
from lmsp.api.sse import as_stored
from lmsp.api.validation import validation_problem
from lmsp.app import follow, tasks
from lmsp.app.service import Service
from lmsp.protocol import events as ev
from lmsp.store import idempotency
from lmsp.store import responses as response_store
from lmsp.store.clients import Client

log = logging.getLogger("lmsp")


async def _stored_frames(
    events: AsyncIterator[tuple[int, str, str]],
) -> AsyncIterator[ServerSentEvent]:
    """The log's events as stored (their JSON is what a frame carries)."""
    async for seq, kind, data in events:
        for event in as_stored(seq, kind, data):
            yield event


#: the paths a socket opens on (the HTTP route's, with its trailing-slash form)
PATHS = ("/v1/responses", "/v1/responses/")
CREATE = "response.create"
#: fields a ``response.create`` must not carry (the specification's three; OpenAI's two)
REFUSED = {
    "stream": "Every turn on a WebSocket streams its events; send it without stream.",
    "stream_options": "A WebSocket turn takes no stream_options.",
    "background": "A stored WebSocket turn runs on if its socket drops; send it without"
    " background.",
    "generate": "generate: false (a warm-up) is not supported here.",
    "stream_id": "One response at a time per socket: open another socket instead.",
}
#: where a turn's idempotency key goes (a POST's ``Idempotency-Key`` header)
KEY_FIELD = "idempotency_key"
LIMIT = "websocket_connection_limit_reached"
#: the ``route`` label :class:`lmsp.api.app.HttpMetrics` counts sockets under
ROUTE_KEY = "lmsp.route"


class Gone(Exception):
    """The client left or stopped reading: the socket ends (``reason``: why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def routes() -> list[WebSocketRoute]:
    return [WebSocketRoute(path, responses_socket) for path in PATHS]


async def responses_socket(websocket: WebSocket) -> None:
    """The upgrade: checked as an HTTP request is, then the socket's turns."""
    noted = websocket.scope.get(ROUTE_KEY)
    if isinstance(noted, dict):
        noted["route"] = PATHS[0]
    svc: Service = websocket.app.state.lmsp
    sockets: Sockets = websocket.app.state.lmsp_sockets
    try:
        refused = cross_site(websocket.scope)
        if refused is not None:
            raise refused
        client = await authorize(websocket, "responses:write")
        opened = sockets.admit(client.id)
    except errors.LmspError as exc:
        await websocket.send_denial_response(error_response(exc, websocket.url.path))
        return
    reason = "server"
    try:
        await websocket.accept()
        reason = await Connection(websocket, svc, client, opened, sockets).serve()
    except Gone as gone:
        reason = gone.reason
    finally:
        sockets.release(opened, reason)


def envelope(exc: errors.LmspError, status: int | None = None) -> str:
    """The specification's error frame: ``{"type": "error", "status", "error"}``."""
    status = status_of(exc.code) if status is None else status
    return json.dumps({"type": "error", "status": status, **error_body(exc, status)})


class Connection:
    """One accepted socket: its turns, one after another, and its cache."""

    def __init__(
        self,
        websocket: WebSocket,
        svc: Service,
        client: Client,
        opened: OpenSocket,
        sockets: Sockets,
    ) -> None:
        self.ws = websocket
        self.svc = svc
        self.client = client
        self.opened = opened
        self.sockets = sockets
        self.cache = wscache.ConnectionCache(svc.settings.ws_cache_bytes)

    async def serve(self) -> str:
        """Turns until the client leaves or a limit is reached; why it ended."""
        settings = self.svc.settings
        deadline = time.monotonic() + settings.ws_max_age
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(
                    self.ws.receive(), max(0.0, min(settings.ws_idle_timeout, left))
                )
            except TimeoutError:
                aged = left <= settings.ws_idle_timeout
                await self.close_limited(aged)
                return "max_age" if aged else "idle"
            if message["type"] == "websocket.disconnect":
                return "client"
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            await self.turn(text)

    async def close_limited(self, aged: bool) -> None:
        settings = self.svc.settings
        if aged:
            why = f"The connection is {settings.ws_max_age:g} s old (LMSP_WS_MAX_AGE)"
        else:
            why = f"No frame came for {settings.ws_idle_timeout:g} s (LMSP_WS_IDLE_TIMEOUT)"
        limit = errors.LmspError(LIMIT, f"{why}; open a new connection to continue.")
        await self.send(envelope(limit, 400))
        await self.ws.close(1000, LIMIT)

    # -- a turn ---------------------------------------------------------------------------
    async def turn(self, text: str) -> None:
        previous: str | None = None
        try:
            frame = parse_frame(text)
            body = _validated(frame)
            previous = body.previous_response_id
            body, seen = self.continued(body)
            given = len(wscache.given_items(frame.get("input")))
            names = [*(["previous_response_id"] * (len(seen) - given)), *_names(given)]
            created = await create_turn(self.svc, body, self.client, lambda: self.key(frame), names)
        except errors.LmspError as exc:
            if exc.code == "not_found" and exc.param == "previous_response_id":
                assert previous is not None
                exc = wscache.not_found(previous)  # the specification's code for it
            if previous is not None:
                self.cache.evict(previous, "A continuation of it failed on this connection.")
            await self.send(envelope(exc, 400 if exc.code == wscache.NOT_FOUND else None))
            return
        except Exception:  # as an HTTP request's 500: the socket stays for the next turn
            log.exception("a WebSocket turn of client %s failed", self.client.id)
            await self.send(envelope(errors.LmspError("internal_error", "Internal server error.")))
            return
        self.sockets.turns += 1
        self.opened.turns += 1
        final = await self.follow(created, body)
        self.remember(final, body, seen, previous)

    def continued(self, body: CreateResponse) -> tuple[CreateResponse, list[dict[str, Any]]]:
        """A continuation of one of this socket's ``store: false`` responses runs with
        its items before the new input (they are nowhere else); ``seen``: what the
        model is shown, as given. Another ``previous_response_id`` is looked up in the
        store, as over HTTP."""
        given = wscache.given_items(body.input)
        previous = body.previous_response_id
        if previous is None or (previous not in self.cache and not self.was_ours(previous)):
            return body, given
        seen = [*self.cache.context(previous), *given]
        return body.model_copy(update={"input": seen, "previous_response_id": None}), seen

    def was_ours(self, previous: str) -> bool:
        """``previous`` was a ``store: false`` response of this socket, now evicted."""
        return previous in self.cache.gone

    async def key(self, frame: dict[str, Any]) -> idempotency.Key | None:
        """``metadata.idempotency_key``, digested with the frame as a POST's body is."""
        raw = (frame.get("metadata") or {}).get(KEY_FIELD)
        if raw is None:
            return None
        if not isinstance(raw, str) or not idempotency.valid_key(raw):
            raise errors.invalid(
                "metadata.idempotency_key must be 1 to 255 visible ASCII characters.",
                param=f"metadata.{KEY_FIELD}",
                code="invalid_idempotency_key",
            )
        digest = idempotency.request_digest("POST", PATHS[0], frame)
        ttl = self.svc.settings.idempotency_ttl
        return idempotency.Key(self.client.id, raw, digest, ttl)

    async def follow(
        self, created: response_store.Created, body: CreateResponse
    ) -> dict[str, Any] | None:
        """Send the response's events as they are logged, up to its terminal one (its
        response object, returned). A ``store: false`` response is deleted once
        finished, and cancelled if the socket goes first; a stored one runs on."""
        svc = self.svc
        assert svc.broker is not None
        forget = None if body.store is not False else (created.response_id, self.client.id)
        hide = ev.hidden_in_stream(body.include)
        source = until_revoked(
            _stored_frames(follow.task_events(svc, created.task_id, -1, hide)),
            svc,
            self.client.id,
        )
        self.opened.response_id = created.response_id
        final: dict[str, Any] | None = None
        try:
            async for event in source:
                if event.event == "error":  # the client's token was revoked
                    await self.revoked()
                if event.event in ev.TERMINAL:
                    final = json.loads(str(event.data))["response"]
                await self.send(str(event.data))
                if final is not None:
                    break
        except Gone:
            if forget is not None and final is None:
                tasks.cancel_nowait(svc, created.task_id)  # its answer could reach no one
            raise
        finally:
            self.opened.response_id = None
            if forget is not None:
                tasks.forget_later(svc, created.task_id, *forget)
        if final is None:
            gone = errors.LmspError("not_found", "The response was deleted while it ran.")
            await self.send(envelope(gone))
        return final

    async def revoked(self) -> None:
        exc = errors.LmspError("token_revoked", "This client's token was revoked.")
        await self.send(envelope(exc, 401))
        await self.ws.close(1008, "token_revoked")
        raise Gone("revoked")

    def remember(
        self,
        final: dict[str, Any] | None,
        body: CreateResponse,
        seen: list[dict[str, Any]],
        previous: str | None,
    ) -> None:
        """After a turn: a ``store: false`` response that finished is kept for the next
        turn; a continuation that failed evicts the response it continued."""
        status = None if final is None else final.get("status")
        if status not in ("completed", "incomplete"):
            if previous is not None:
                self.cache.evict(previous, "A continuation of it failed on this connection.")
        elif final is not None and body.store is False:
            self.cache.add(str(final["id"]), seen, list(final.get("output") or []))
        self.opened.cached_bytes = self.cache.size

    async def send(self, text: str) -> None:
        """One text frame, or :class:`Gone`: the client left, or took nothing for
        ``LMSP_WS_SEND_TIMEOUT`` (what it has not read stays in the transport's buffer,
        bounded: the events stay on disk)."""
        try:
            async with asyncio.timeout(self.svc.settings.ws_send_timeout):  # no task a frame
                await self.ws.send_text(text)
        except TimeoutError:
            log.info("a WebSocket of client %s stopped reading; closed", self.client.id)
            raise Gone("slow_reader") from None
        except (WebSocketDisconnect, OSError, RuntimeError):
            raise Gone("client") from None


def parse_frame(text: str) -> dict[str, Any]:
    """A client frame: a JSON object of type ``response.create`` (its other fields the
    create body); refused as an HTTP body would be, or for a field a socket forbids."""
    try:
        frame = json.loads(text)
    except RecursionError:
        raise errors.invalid("The frame is nested too deeply.", code="invalid_json") from None
    except ValueError:
        raise errors.invalid("The frame is not valid JSON.", code="invalid_json") from None
    if not isinstance(frame, dict):
        raise errors.invalid("A frame is a JSON object.", code="invalid_json")
    try:
        inputs.refuse_lone_surrogates(frame)
    except RecursionError:
        raise errors.invalid("The frame is nested too deeply.", code="invalid_json") from None
    kind = frame.pop("type", None)
    if kind != CREATE:
        raise errors.LmspError(
            "invalid_value",
            f"type: a client frame is {{'type': {CREATE!r}, …}}; got {kind!r}.",
            param="type",
        )
    for name, why in REFUSED.items():
        if name in frame:
            raise errors.LmspError("unsupported_parameter", f"{name}: {why}", param=name)
    return frame


def _names(count: int) -> list[str]:
    return [f"input.{index}" for index in range(count)]


def _validated(frame: dict[str, Any]) -> CreateResponse:
    try:
        return CreateResponse.model_validate(frame)
    except pydantic.ValidationError as exc:
        raise validation_problem(list(exc.errors())) from None  # type: ignore[arg-type]
