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
from collections.abc import Iterator
from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from lmsp import errors
from lmsp.api import direct
from lmsp.api.auth import require
from lmsp.api.message_schemas import CountTokens, MessageCreate, check_message
from lmsp.api.params import ReplayQuery
from lmsp.api.routes.deps import answered, idempotency_key, service, translated_request
from lmsp.api.sse import MessagesPing, sse
from lmsp.api.streams import followed
from lmsp.app import follow, responses, tasks, toolcheck
from lmsp.app.core import Core
from lmsp.protocol import items, message_events, messages
from lmsp.protocol.chat import Untranslatable
from lmsp.protocol.itemtypes import typed
from lmsp.protocol.request import CreateRequest
from lmsp.protocol.tools import typed_choice, typed_tools
from lmsp.store.clients import Client

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
    prompt = prompt_of(body)
    counting = translated_request(
        {"model": body.model, **prompt.given}, 0, None, "", **prompt.typed
    )
    try:
        counted = await responses.count_prompt(service(request), client, counting)
    except errors.LmspError as exc:
        raise _named_models(exc) from None
    return {"input_tokens": counted}


@router.get("/{message_id}")
async def retrieve_message(
    message_id: str,
    request: Request,
    client: Reader,
    replay: ReplayQuery,
) -> Response:
    """An LMSP extension: the message as it stands, or with ``stream=true`` its stream
    events again (from the start, or after the log's sequence number ``starting_after``
    or ``Last-Event-ID``), then live ones until it ends."""
    core = service(request)
    found = await responses.find(core, message_id, client)
    if replay.stream:
        after = replay.after
        start = await core.read(follow.attempt_start, core, found.task)
        return _stream(request, found.task_id, client, after=after, start=start, cancel=False)
    return JSONResponse(await core.read(_message, core, found.task_id))


def _named_models(exc: errors.LmspError) -> errors.LmspError:
    """An unknown model's ``404`` (:func:`lmsp.app.models.resolve`, the same on every
    route) says how Claude Code names another: it asks for Claude's names unless told."""
    if exc.code != "model_not_found":
        return exc
    hint = " (Claude Code: set ANTHROPIC_MODEL, or pass --model.)"
    return errors.LmspError(exc.code, exc.message + hint, param=exc.param)


# -- answers --------------------------------------------------------------------------------
def _message(core: Core, task_id: str) -> dict[str, Any]:
    """The ``message`` object of a task as it stands (in a reader thread); a failed or
    cancelled one raises its error."""
    obj = responses.response_object(core, task_id)
    if obj["status"] in ("failed", "cancelled"):
        _, text = message_events.failure(obj)
        code = "cancelled" if obj["status"] == "cancelled" else (obj["error"] or {}).get("code")
        raise errors.LmspError(code or "engine_error", text)
    stop = None
    if obj["status"] == "completed" and not any(
        item.get("type") == "function_call" for item in obj["output"]
    ):
        # the stop sequence that ended its text, from its last events
        closing = follow.closing_events(core, task_id, CLOSING_EVENTS)
        stop = messages.stop_sequence_of(closing)
    return messages.message(obj, stop)


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
    core = service(request)
    obj = responses.response_object(core, task_id)
    translator = message_events.MessageEvents(obj["id"], obj["model"])

    def frames(seq: int, kind: str, data: str) -> Iterator[ServerSentEvent]:
        out = translator.feed(json.loads(data))
        if seq <= after:
            return
        for index, (name, payload) in enumerate(out):
            event_id = str(seq) if index == len(out) - 1 else None
            yield sse(json.dumps(payload, separators=(",", ":")), event=name, event_id=event_id)

    return followed(
        core,
        tasks.Departure(core, task_id, cancel),
        frames,
        client=client,
        start=start,
        headers=headers,
        done=False,
        keepalive=MessagesPing,
        terminal=TERMINAL,
    )


#: ``POST /v1/messages`` answered below the router (:mod:`lmsp.api.direct`)
DIRECT = direct.Route(
    "/v1/messages", create_message, MessageCreate, "responses:write", api_key=True
)
