"""Compaction: the older items of a history replaced by one ``compaction`` item holding
a summary the model writes (``POST /v1/responses/compact``, and ``context_management``
on a create).

The summary is generated like any other response: a task of the client's, queued,
run by the runner on the engine (so it waits its turn, survives a restart per its
``on_restart`` and is counted like the rest), then deleted once read. The compaction
item carries it in ``encrypted_content`` (:mod:`lmsp.protocol.compaction`), which lmsp
reads back when the item is sent as input: the summary costs the prompt its own few
tokens instead of the older items'.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec

from lmsp import errors
from lmsp.ids import new_id
from lmsp.ids import now as _now
from lmsp.protocol import compaction, items, objects
from lmsp.protocol.itemtypes import InputItem, plain_all, typed
from lmsp.protocol.request import Compacted, CreateRequest, PreparedRequest
from lmsp.runner.plan import full_context_of, messages_of, tools_of
from lmsp.store import conversations as conversation_store
from lmsp.store import models
from lmsp.store import responses as response_store
from lmsp.store.clients import Client

if TYPE_CHECKING:
    from lmsp.app.service import Service

Item = InputItem
#: the longest summary the model may write (tokens)
SUMMARY_TOKENS = 256


async def summarize(
    svc: Service, client: Client, model: str, older: list[Item], instructions: str | None
) -> tuple[str, dict[str, Any] | None]:
    """The model's summary of ``older`` and the usage of writing it: one response,
    run as a task (greedy, retried after a restart), deleted once read."""
    text = compaction.transcript(items.render(older, instructions))
    request = CreateRequest(
        model=model,
        given=f"Summarize this conversation:\n\n{text}",
        instructions=compaction.SUMMARY_INSTRUCTIONS,
        temperature=0.0,
        max_output_tokens=SUMMARY_TOKENS,
        seed=0,
        on_restart="retry",
        store=True,
    )
    try:
        created = await svc.create(client, request, None)
    except errors.LmspError as exc:
        if exc.code != "context_length_exceeded":
            raise
        raise errors.LmspError(
            "context_length_exceeded",
            f"The items to compact are too long for {model!r} to summarize at once: {exc}"
            " Compact a shorter history (e.g. in two steps).",
            param="input",
        ) from None
    written = False
    try:
        await svc.wait_finished(created.task_id)
        written = True
        obj = await svc.read(svc.response_object, created.task_id)
    finally:  # the summary was the client's only while it was written
        if written:
            await asyncio.shield(
                svc.db.write(lambda c: response_store.delete(c, created.response_id, client.id))
            )
        else:  # nobody waits for it any more (its client left): it stops, then goes
            svc.cancel_nowait(created.task_id)
            svc.forget_later(created.task_id, created.response_id, client.id)
    if obj["status"] not in ("completed", "incomplete"):
        error = obj.get("error") or {}
        raise errors.LmspError(
            "compaction_failed",
            f"The model could not write the summary ({obj['status']}):"
            f" {error.get('message', 'no reason given')}",
        )
    summary = "".join(
        part.get("text", "")
        for item in obj["output"]
        if item.get("type") == "message"
        for part in item.get("content", [])
    ).strip()
    return summary, obj.get("usage")


async def compact_items(
    svc: Service, client: Client, model: str, context: list[Item], instructions: str | None
) -> tuple[list[Item], dict[str, Any] | None]:
    """``context`` compacted: one compaction item for its older items, then the newest
    ones as they are (:func:`lmsp.protocol.compaction.split`); unchanged (and no usage)
    when there is nothing older to compact."""
    older, kept = compaction.split(context)
    if not older:
        return list(context), None
    summary, usage = await summarize(svc, client, model, older, instructions)
    return [compaction.item(summary, len(older), new_id, svc.compaction_key), *kept], usage


async def compact_request(
    svc: Service, client: Client, record: models.ModelRecord, request: PreparedRequest, over: int
) -> PreparedRequest:
    """``context_management``: if the prompt of ``request`` passes ``over`` tokens, the
    request with its compacted input instead (the compaction recorded in it)."""
    size = await svc.read(
        lambda: svc.host.prompt_size(record, messages_of(request), tools_of(request))
    )
    if size is None or size[0] <= over:
        return request
    context = full_context_of(request)
    compacted, _ = await compact_items(svc, client, request.model, context, request.instructions)
    if len(compacted) == len(context):
        return request
    record_of = Compacted(items=len(context), input_tokens=size[0], threshold=over)
    return msgspec.structs.replace(
        request, input=tuple(compacted), history=None, compacted=record_of
    )


async def compact(
    svc: Service,
    client: Client,
    model: str,
    given: Any,
    instructions: str | None,
    previous: str | None,
) -> dict[str, Any]:
    """``POST /v1/responses/compact``: the ``response.compaction`` object."""
    record = await svc.read(lambda: models.get(svc.db.reader(), model))
    if record is None:
        raise errors.LmspError(
            "model_not_found", f"The model {model!r} does not exist.", param="model"
        )
    own: list[Item] = []
    if given is not None:
        checked = await asyncio.to_thread(
            items.normalize,
            given,
            capabilities=models.capabilities(record),
            compaction_key=svc.compaction_key,
        )
        own = list(await svc.files.with_texts(typed(checked), lambda i: f"input.{i}"))
    history: list[Item] = []
    if previous is not None:
        history = await svc.read(
            lambda: response_store.conversation(svc.db.reader(), previous, client.id)
        )
    context = [*history, *own]
    if not context:
        raise errors.LmspError(
            "missing_required_parameter",
            "Nothing to compact: send input or previous_response_id.",
            param="input",
        )
    output, usage = await compact_items(svc, client, model, context, instructions)
    zero = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": _now(),
        "output": [conversation_store.shown(item) for item in plain_all(output)],
        "usage": usage or objects.render_usage(zero),
    }
