"""``/v1/messages``: the Anthropic Messages API on the durable core.

Each message is a stored response with its task and event log, like a chat completion:
persisted before work starts, ``Idempotency-Key`` honoured, listed by ``lmsp tasks``,
cancellable. Its ``id`` is the response's, so ``GET /v1/messages/{id}`` (an LMSP
extension) follows it again after a dropped stream or a restart, Messages-shaped, and
``GET /v1/responses/{id}`` shows it Responses-shaped. Errors on these routes come in
Anthropic's envelope (:mod:`lmsp.api.errors`); a token may come in ``x-api-key``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from lmsp import errors
from lmsp.api import inputs
from lmsp.api.auth import require
from lmsp.api.message_schemas import CountTokens, MessageCreate, check_message
from lmsp.api.revocation import until_revoked
from lmsp.api.routes.deps import answered, idempotency_key, service, translated_request
from lmsp.api.sse import MessagesPing, event_response, sse, task_events
from lmsp.app import toolcheck
from lmsp.app.service import Service
from lmsp.protocol import events as ev
from lmsp.protocol import items, messages
from lmsp.protocol.chat import Untranslatable
from lmsp.protocol.itemtypes import typed
from lmsp.protocol.request import CreateRequest
from lmsp.protocol.tools import typed_choice, typed_tools
from lmsp.runner.plan import messages_of, tools_of
from lmsp.store import events
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.db import Database

router = APIRouter(prefix="/v1/messages", tags=["messages"])

Reader = Annotated[Client, Depends(require("responses:read", api_key=True))]
Writer = Annotated[Client, Depends(require("responses:write", api_key=True))]
REPLAYED = {"Idempotent-Replayed": "true"}
#: the events after which a client that leaves has all it needs
TERMINAL = frozenset({"message_stop", "error"})
#: how many events before a task's last one its ``output_text.done`` can be
CLOSING_EVENTS = 8


class Prompt(NamedTuple):
    """The prompt-making fields of a Messages body in their Responses form: ``given``
    (``instructions``, ``parallel_tool_calls``, ``text``) and ``typed`` (``input``, its
    items checked once, ``tools`` and ``tool_choice``)."""

    given: dict[str, Any]
    typed: dict[str, Any]


def prompt_of(body: CountTokens) -> Prompt:
    """The prompt of a Messages body, parsed once (see :class:`Prompt`)."""
    check_message(body)
    try:
        translated = messages.items_from_messages([m.model_dump() for m in body.messages])
        instructions = messages.system_text(body.system)
        tools = messages.function_tools(body.tools or [])
    except Untranslatable as exc:
        raise errors.LmspError(exc.code, exc.message, param=exc.param) from exc
    given = body.tool_choice.model_dump(exclude_none=True) if body.tool_choice else None
    choice, parallel = messages.tool_choice(given)
    output = body.output_config.format if body.output_config else None
    fmt = None
    if output is not None:
        fmt = {"type": "json_schema", "name": "output", "schema": output.schema_}
    stop = body.stop_sequences if isinstance(body, MessageCreate) else None
    for problem in toolcheck.problems(tools, choice, fmt, stop, messages.tools_param):
        raise problem
    checked = typed(
        items.normalize_item(item, f"messages.{origin}")
        for item, origin in zip(translated.items, translated.origin, strict=True)
    )
    plain = {
        "instructions": instructions,
        "parallel_tool_calls": parallel,
        "text": {"format": fmt} if fmt else None,
    }
    return Prompt(
        plain,
        {
            "input": checked,
            "tools": typed_tools(tools) if tools else None,
            "tool_choice": typed_choice(choice),
        },
    )


def create_request(body: MessageCreate, on_restart: str) -> CreateRequest:
    """The Responses create a message is, parsed once."""
    user = body.metadata.user_id if body.metadata else None
    prompt = prompt_of(body)
    given: dict[str, Any] = {
        "model": body.model,
        **prompt.given,
        "max_output_tokens": body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stop": body.stop_sequences,
        "metadata": {"user_id": user} if user else None,
        "stream": bool(body.stream),
        "background": False,
        "store": True,
    }
    return translated_request(given, body.seed, body.on_restart, on_restart, **prompt.typed)


@router.post("")
async def create_message(body: MessageCreate, request: Request, client: Writer) -> Response:
    """Create a message (Anthropic's Messages API); ``stream: true`` answers its events."""
    svc = service(request)
    given = create_request(body, svc.settings.default_on_restart)
    key = await idempotency_key(request, client)
    try:
        created = await svc.create(
            client, given, key, input_param="messages", param=messages.tools_param
        )
    except errors.LmspError as exc:
        raise _named_models(exc) from None
    headers = dict(REPLAYED) if created.replayed else {}
    if body.stream:
        return _stream(request, created.task_id, client, headers=headers, cancel=True)
    await answered(request, created.task_id)
    return JSONResponse(await svc.read(_message, svc, created.task_id), headers=headers)


@router.post("/count_tokens")
async def count_tokens(body: CountTokens, request: Request, client: Writer) -> dict[str, int]:
    """The prompt's tokens, counted with the model's own tokenizer and chat template (as
    the context check of a create does)."""
    svc = service(request)
    prompt = prompt_of(body)
    counted = translated_request({"model": body.model, **prompt.given}, 0, None, "", **prompt.typed)
    try:
        record = await svc.model(body.model, client)
    except errors.LmspError as exc:
        raise _named_models(exc) from None
    shown = messages_of(counted, counted.input)
    size = await svc.read(svc.host.prompt_size, record, shown, tools_of(counted))
    if size is None:
        raise errors.LmspError(
            "model_load_failed", f"The tokenizer of {body.model!r} cannot be read now."
        )
    return {"input_tokens": size[0]}


@router.get("/{message_id}")
async def retrieve_message(
    message_id: str,
    request: Request,
    client: Reader,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1, le=inputs.MAX_SEQUENCE)] = -1,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """An LMSP extension: the message as it stands, or with ``stream=true`` its stream
    events again (from the start, or after the log's sequence number ``starting_after``
    or ``Last-Event-ID``), then live ones until it ends."""
    svc = service(request)
    _, task = await svc.read(svc.owned_response, message_id, client)
    if stream:
        after = inputs.resume_after(starting_after, last_event_id)
        start = await svc.read(_attempt_start, svc.db, task)
        return _stream(request, task["id"], client, after=after, start=start, cancel=False)
    return JSONResponse(await svc.read(_message, svc, task["id"]))


def _named_models(exc: errors.LmspError) -> errors.LmspError:
    """An unknown model's ``404`` (:meth:`Service.model`, the same on every route) says
    how Claude Code names another: it asks for Claude's names unless told."""
    if exc.code != "model_not_found":
        return exc
    hint = " (Claude Code: set ANTHROPIC_MODEL, or pass --model.)"
    return errors.LmspError(exc.code, exc.message + hint, param=exc.param)


# -- answers --------------------------------------------------------------------------------
def _message(svc: Service, task_id: str) -> dict[str, Any]:
    """The ``message`` object of a task as it stands (in a reader thread); a failed or
    cancelled one raises its error."""
    obj = svc.response_object(task_id)
    if obj["status"] in ("failed", "cancelled"):
        _, text = messages.failure(obj)
        code = "cancelled" if obj["status"] == "cancelled" else (obj["error"] or {}).get("code")
        raise errors.LmspError(code or "engine_error", text)
    stop = None
    if obj["status"] == "completed" and not any(
        item.get("type") == "function_call" for item in obj["output"]
    ):
        stop = _stop_sequence(svc.db, task_id)
    return messages.message(obj, stop)


def _stop_sequence(db: Database, task_id: str) -> str | None:
    """The stop sequence that ended a finished task's text, from its last events."""
    conn = db.reader()
    task = task_store.get(conn, task_id)
    if task is None:
        return None
    since = max(-1, int(task["last_sequence_number"]) - CLOSING_EVENTS)
    rows = events.after(conn, task_id, since, CLOSING_EVENTS + 1)
    return messages.stop_sequence_of([json.loads(data) for _, _, data in rows])


def _attempt_start(db: Database, task: Any) -> int:
    """Where a follower's translation starts: before the last ``reset`` of a retried
    task (the output before it is void), else at the start of the log."""
    if int(task["attempt"]) <= 1:
        return -1
    conn = db.reader()
    start = last = -1
    while rows := events.after(conn, task["id"], last, 1000):
        for seq, kind, data in rows:
            last = seq
            if kind == ev.QUEUED and json.loads(data).get("reset"):
                start = seq - 1
    return start


def _stream(
    request: Request,
    task_id: str,
    client: Client,
    *,
    headers: dict[str, str] | None = None,
    after: int = -1,
    start: int = -1,
    cancel: bool,
) -> Response:
    """The task's log as Messages stream events. Every event carries the log sequence
    number it came from as its ``id:`` (only the last of several from one log event),
    so ``Last-Event-ID`` resumes it; events from numbers up to ``after`` are skipped.
    ``cancel``: a client that leaves before the end cancels the task."""
    svc = service(request)
    assert svc.broker is not None
    broker = svc.broker
    obj = svc.response_object(task_id)
    translator = messages.MessageEvents(obj["id"], obj["model"])

    async def source() -> AsyncIterator[ServerSentEvent]:
        async for seq, _, data in task_events(svc.db, broker, task_id, start):
            out = translator.feed(json.loads(data))
            if seq <= after:
                continue
            for index, (name, payload) in enumerate(out):
                event_id = str(seq) if index == len(out) - 1 else None
                yield sse(json.dumps(payload, separators=(",", ":")), event=name, event_id=event_id)

    def on_disconnect() -> None:
        if cancel:
            svc.cancel_nowait(task_id)

    events_out = until_revoked(source(), svc.db, broker, client.id, on_revoked=on_disconnect)
    return event_response(
        events_out,
        on_disconnect=on_disconnect,
        headers=headers,
        ping=svc.settings.sse_ping,
        keepalive=MessagesPing,
        terminal=TERMINAL,
    )
