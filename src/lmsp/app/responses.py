"""Responses once created: find one, show it as it stands, page its input items, cancel
it, delete it (``/v1/responses``, and the Chat / Completions / Messages faces that show
the same responses). Creating one is :meth:`lmsp.app.service.Service.create`.

A response is its client's: another client's id is ``404``; ``admin`` sees every one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lmsp import errors
from lmsp.app import models, tasks
from lmsp.app.core import Core
from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.request import CreateRequest
from lmsp.runner.plan import messages_of, tools_of
from lmsp.store import idempotency
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client


@dataclass(frozen=True)
class Found:
    """A response a client may see, and its task."""

    response: ResponseRecord
    task: TaskRecord

    @property
    def task_id(self) -> str:
        return self.task.id


def owned(core: Core, response_id: str, client: Client) -> Found:
    """The response and its task if ``client`` may see it (its own; ``admin``: any),
    else ``404`` (in a reader thread)."""
    conn = core.db.reader()
    response = task_store.get_response(conn, response_id)
    if response is None or not client.oversees(response.client_id):
        raise errors.not_found("response", response_id)
    task = task_store.of_response(conn, response_id)
    if task is None:  # deleted between the two reads
        raise errors.not_found("response", response_id)
    return Found(response, task)


async def find(core: Core, response_id: str, client: Client) -> Found:
    """:func:`owned`, off the event loop."""
    return await core.read(owned, core, response_id, client)


def response_object(core: Core, task_id: str) -> dict[str, Any]:
    """The response object of a task as it stands (in a reader thread)."""
    conn = core.db.reader()
    task = task_store.get(conn, task_id)
    if task is None:
        raise errors.not_found("task", task_id)
    return task_store.render_response(conn, task)


async def current(core: Core, task_id: str) -> dict[str, Any]:
    """:func:`response_object`, off the event loop."""
    return await core.read(response_object, core, task_id)


async def input_items(
    core: Core,
    found: Found,
    order: Literal["asc", "desc"],
    after: str | None,
    limit: int,
) -> dict[str, Any]:
    """The items the model was given (a conversation's earlier turns first), as a page:
    its history expanded (``409 history_deleted`` if a response of it was deleted); a
    conversation's items are read a page at a time."""
    return await core.read(
        lambda: response_store.input_items(core.db.reader(), found.response, order, after, limit)
    )


async def cancel(
    core: Core, found: Found, key: idempotency.Key | None
) -> tuple[dict[str, Any], bool]:
    """Cancel a response :func:`find` found (once per idempotency key): the object as
    it stands then, and whether this was a replay of the key (nothing done again)."""
    task_id = found.task_id
    if key is not None:
        replay = await core.db.write(lambda c: idempotency.remember(c, key, found.response.id))
        if replay:
            return await current(core, task_id), True
    await tasks.cancel(core, task_id, wait=core.settings.cancel_wait)
    return await current(core, task_id), False


async def delete(core: Core, response_id: str, client: Client) -> None:
    """Delete a finished response with its task and events: ``404`` for one the client
    may not see, ``409 response_in_progress`` for one unfinished."""
    found = await find(core, response_id, client)
    owner = found.response.client_id  # the owner's (an admin may delete any response)
    outcome = await core.db.write(lambda c: response_store.delete(c, response_id, owner))
    if outcome == "missing":
        raise errors.not_found("response", response_id)
    if outcome == "conflict":
        raise errors.LmspError(
            "response_in_progress", "The response is unfinished; cancel it first."
        )


async def forget(core: Core, response_id: str, client_id: str) -> None:
    """A ``store: false`` response its client has read: it goes now."""
    await core.db.write(lambda c: response_store.delete(c, response_id, client_id))


async def count_prompt(core: Core, client: Client, prompt: CreateRequest) -> int:
    """The tokens of ``prompt`` (its input items, with its ``instructions`` and
    ``tools``), counted with its model's own tokenizer and chat template as the context
    check of a create counts them."""
    record = await models.resolve(core, prompt.model, client)
    shown = messages_of(prompt, prompt.input)
    size = await core.read(core.host.prompt_size, record, shown, tools_of(prompt))
    if size is None:
        raise errors.LmspError(
            "model_load_failed", f"The tokenizer of {prompt.model!r} cannot be read now."
        )
    return size[0]
