"""``POST /v1/completions``: legacy text completions on the durable core.

The prompt goes to the model as raw text, without the chat template: it is stored as the
response's one input item, marked raw (:mod:`lmsp.protocol.completions`), and the task
runs like any other (persisted first, ``Idempotency-Key`` honoured, cancellable,
resumable). The completion's id is its response's.
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
from lmsp.api.schemas import COMPLETION_MAX_TOKENS, CompletionCreate, check_completion
from lmsp.api.sse import sse
from lmsp.api.streams import followed
from lmsp.app import responses, tasks
from lmsp.protocol import completions
from lmsp.protocol.request import CreateRequest
from lmsp.store.clients import Client

router = APIRouter(prefix="/v1", tags=["completions"])

Writer = Annotated[Client, Depends(require("responses:write"))]
REPLAYED = {"Idempotent-Replayed": "true"}


def create_request(body: CompletionCreate, prompt: str, on_restart: str) -> CreateRequest:
    """The Responses create a completion is: its prompt as the one input item, read raw."""
    stop = body.stop
    given: dict[str, Any] = {
        "model": body.model,
        "given": prompt,
        completions.RAW: True,
        "max_output_tokens": body.max_tokens or COMPLETION_MAX_TOKENS,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repeat_penalty": body.repeat_penalty,
        "stop": [stop] if isinstance(stop, str) else stop,
        "user": body.user,
        "stream": bool(body.stream),
        "background": False,
        "store": True,
    }
    return translated_request(given, body.seed, body.on_restart, on_restart)


@router.post("/completions")
async def create_completion(body: CompletionCreate, request: Request, client: Writer) -> Response:
    """A legacy text completion: the prompt as raw text in, the text that follows out."""
    svc = service(request)
    prompt = check_completion(body)
    given = create_request(body, prompt, svc.settings.default_on_restart)
    key = await idempotency_key(request, client)
    created = await svc.create(client, given, key, input_param="prompt")
    headers = dict(REPLAYED) if created.replayed else {}
    if body.stream:
        return _stream(request, created.task_id, body, headers, client)
    obj = await finished_chat(request, created.task_id)
    return JSONResponse(completions.completion(obj), headers=headers)


def _stream(
    request: Request,
    task_id: str,
    body: CompletionCreate,
    headers: dict[str, str],
    client: Client,
) -> Response:
    core = service(request)
    obj = responses.response_object(core, task_id)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunks = completions.CompletionStream(
        obj["id"], obj["created_at"], obj["model"], include_usage, obj.get("model_digest")
    )

    def frames(seq: int, kind: str, data: str) -> Iterator[ServerSentEvent]:
        for chunk in chunks.feed(json.loads(data)):
            shown = error_body(errors.LmspError(**chunk["error"])) if "error" in chunk else chunk
            yield sse(json.dumps(shown, separators=(",", ":")))

    departure = tasks.Departure(core, task_id)
    return followed(core, departure, frames, client=client, headers=headers)


#: ``POST /v1/completions`` answered below the router (:mod:`lmsp.api.direct`)
DIRECT = direct.Route("/v1/completions", create_completion, CompletionCreate, "responses:write")
