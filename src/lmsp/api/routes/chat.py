"""``POST /v1/chat/completions``: the Chat Completions API on the durable core.

Each completion is a stored response with its task and event log: the messages are
translated into Responses input items, the answer is rendered from the finished response
(or, streamed, from its event log), and the completion's id is the response's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from lmsp import errors
from lmsp.api import direct
from lmsp.api.auth import require
from lmsp.api.errors import body as error_body
from lmsp.api.routes.deps import finished_chat, idempotency_key, service, translated_request
from lmsp.api.schemas import ChatCompletionCreate, ReadTools, check_chat
from lmsp.api.sse import sse
from lmsp.api.streams import followed
from lmsp.app import responses, tasks, toolcheck
from lmsp.protocol import chat, items
from lmsp.protocol.itemtypes import Items, typed
from lmsp.protocol.request import CreateRequest
from lmsp.protocol.tools import typed_choice, typed_tools
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1/chat", tags=["chat"])

Writer = Annotated[Client, Depends(require("responses:write"))]
REPLAYED = {"Idempotent-Replayed": "true"}


def _translated(body: ChatCompletionCreate) -> chat.Translated:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        return chat.items_from_messages(messages)
    except chat.Untranslatable as exc:
        raise errors.LmspError(exc.code, exc.message, param=exc.param) from exc


def _input_items(body: ChatCompletionCreate, translated: chat.Translated) -> Items:
    """``messages`` as input items, each one checked as ``/v1/responses`` checks it."""
    return typed(
        items.normalize_item(item, f"messages.{origin}")
        for item, origin in zip(translated.items, translated.origin, strict=True)
    )


def item_names(translated: chat.Translated) -> list[str]:
    """How errors name each input item: by the message it came from."""
    return [f"messages.{origin}" for origin in translated.origin]


def create_request(
    body: ChatCompletionCreate, read: ReadTools, translated: chat.Translated, on_restart: str
) -> CreateRequest:
    """The Responses create a chat completion is, parsed once (``read``: its tools and
    ``tool_choice`` as :func:`check_chat` read them)."""
    stop = body.stop
    given_format = (
        body.response_format.model_dump(exclude_none=True) if body.response_format else None
    )
    fmt = toolcheck.chat_format(given_format)
    given: dict[str, Any] = {
        "model": body.model,
        "max_output_tokens": body.max_completion_tokens or body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "top_logprobs": body.top_logprobs,
        "stop": [stop] if isinstance(stop, str) else stop,
        "parallel_tool_calls": body.parallel_tool_calls,
        "text": {"format": fmt} if fmt else None,
        "metadata": body.metadata,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "service_tier": body.service_tier,
        "stream": bool(body.stream),
        "background": False,
        "store": body.store is not False,
    }
    return translated_request(
        given,
        body.seed,
        body.on_restart,
        on_restart,
        input=_input_items(body, translated),
        tools=typed_tools(read.tools) if read.tools else None,
        tool_choice=typed_choice(read.choice),
    )


def _error(payload: dict[str, Any]) -> dict[str, Any]:
    """A failed or cancelled completion's error in the section-8 shape."""
    return error_body(errors.LmspError(payload["code"], payload["message"]))


@router.post("/completions")
async def create_chat_completion(
    body: ChatCompletionCreate, request: Request, client: Writer
) -> Response:
    svc = service(request)
    read = check_chat(body)
    translated = _translated(body)
    given = create_request(body, read, translated, svc.settings.default_on_restart)
    key = await idempotency_key(request, client)
    created = await svc.create(
        client,
        given,
        key,
        input_param="messages",
        item_names=item_names(translated),
        param=toolcheck.chat_param,
    )
    headers = dict(REPLAYED) if created.replayed else {}
    forget = None if body.store is not False else (created.response_id, client.id)
    if body.stream:
        return _stream(request, created.task_id, body, forget, headers, client)
    obj = await finished_chat(request, created.task_id, forget)
    return JSONResponse(chat.completion(obj), headers=headers)


def _stream(
    request: Request,
    task_id: str,
    body: ChatCompletionCreate,
    forget: tuple[str, str] | None,
    headers: dict[str, str],
    client: Client | None = None,
) -> Response:
    core = service(request)
    obj = responses.response_object(core, task_id)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunks = chat.ChunkStream(obj["id"], obj["created_at"], obj["model"], include_usage)

    def frames(seq: int, kind: str, data: str) -> Iterator[ServerSentEvent]:
        for chunk in chunks.feed(json.loads(data)):
            shown = _error(chunk["error"]) if "error" in chunk else chunk
            yield sse(json.dumps(shown, separators=(",", ":")))

    departure = tasks.Departure(core, task_id, forget=forget)
    return followed(core, departure, frames, client=client, headers=headers)


#: ``POST /v1/chat/completions`` answered below the router (:mod:`lmsp.api.direct`)
DIRECT = direct.Route(
    "/v1/chat/completions", create_chat_completion, ChatCompletionCreate, "responses:write"
)
