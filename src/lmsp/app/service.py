"""The create use case: a response and its task persisted once the request is checked,
its prompt counted and fitted to the model's context (``/v1/responses`` and the Chat,
Completions and Messages faces, whose translators produce the same request).

:class:`Service` is the running service (:class:`lmsp.app.core.Core`, built by
:func:`lmsp.app.root.open_service`) with this use case; the other use cases are the
modules of :mod:`lmsp.app`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from lmsp import errors
from lmsp.app import compaction, fitting, model_cache, responses, toolcheck, toolresults
from lmsp.app import models as model_uses
from lmsp.app.core import Core
from lmsp.fairgate import Ticket
from lmsp.protocol import items, itemtypes
from lmsp.protocol import request as stored_request
from lmsp.protocol.itemtypes import InputItem
from lmsp.protocol.request import CreateRequest, PreparedRequest
from lmsp.runner import early
from lmsp.runner.plan import messages_of, tools_of
from lmsp.runner.runner import Taken
from lmsp.sandbox import WALL_FACTOR
from lmsp.store import clients as client_store
from lmsp.store import conversations as conversation_store
from lmsp.store import idempotency, mcp_headers, models
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn

log = logging.getLogger("lmsp")
#: times a create is prepared at most while its model keeps changing under it
TRIES = 3


def _context_advice(request: PreparedRequest, input_param: str) -> str:
    """What a client whose prompt does not fit can do, in the terms of its API: only
    ``/v1/responses`` has ``truncation``."""
    if request.truncation == "auto":
        return " Even its last input item alone does not fit."
    larger = " or serve the model with a larger context (LMSP_N_CTX)."
    if input_param == "input":
        return ' truncation: "auto" drops the oldest input items to fit;' + larger
    return f" Send a shorter {input_param} (fewer or shorter items),{larger}"


class Service(Core):
    """The running service with its create use case."""

    async def model(self, name: str, client: Client) -> models.ModelRecord:
        """The model ``name`` names (its id or an alias), or ``404 model_not_found``."""
        return await model_uses.resolve(self, name, client)

    def response_object(self, task_id: str) -> dict[str, Any]:
        """The response object of a task as it stands (in a reader thread)."""
        return responses.response_object(self, task_id)

    def fit(self, record: models.ModelRecord, request: PreparedRequest) -> fitting.Size | None:
        """``(prompt tokens, context)`` as :meth:`create` counts them (``input_tokens``),
        exact even for a prompt too long (without ``truncation: "auto"``)."""
        return self._fit(record, request, exact=True)[0]

    def _fit(
        self, record: models.ModelRecord, request: PreparedRequest, *, exact: bool = False
    ) -> tuple[fitting.Size | None, PreparedRequest]:
        """``(prompt tokens, context)`` of ``request`` (``None``: not known before it
        runs), and the request with its history read newest first only as far as the
        context holds it, and with ``truncation: "auto"`` its oldest context items
        dropped, the fewest that make it fit, as the Responses API defines it
        (:func:`lmsp.app.fitting.fit`). In a reader thread."""
        history: Iterable[conversation_store.Turn] = ()
        previous = request.previous_response_id
        turn = request.turn
        if turn is not None:  # a conversation's items so far, a page at a time
            history = conversation_store.newest_first(self.db.reader(), *turn)
        elif previous is not None:
            history = response_store.newest_first(self.db.reader(), previous)
        tools = tools_of(request)

        def measure(context: list[InputItem]) -> tuple[int, int] | None:
            return self.host.prompt_size(record, messages_of(request, context), tools)

        return fitting.fit(request, history, measure, exact=exact)

    async def create(
        self,
        client: Client,
        given: CreateRequest,
        key: idempotency.Key | None,
        input_param: str = "input",
        *,
        item_names: list[str] | None = None,
        param: toolcheck.Param = toolcheck.responses_param,
        compact_over: int | None = None,
    ) -> response_store.Created:
        """Persist a response and its task (``/v1/responses`` and chat completions): the
        model must exist, its schemas compile within their budget, its files read as
        text, and the prompt fit its context; a replayed idempotency key gives the first
        request's response, or ``409`` while that (non-background) request is still
        running. ``item_names``: how errors name each input item (``input.3`` by
        default); ``param``: how they name the other fields. ``compact_over``
        (``context_management``): a prompt of more tokens has its older items compacted
        first (:mod:`lmsp.app.compaction`)."""
        for _ in range(TRIES):
            resolved = await self.model_cache.resolve(given.model, self.read)
            try:
                return await self._create(
                    client, given, key, input_param, item_names, param, compact_over, resolved
                )
            except model_cache.Changed:  # its record changed before the write: again
                self.model_cache.forget(given.model)
        raise model_cache.changing(given.model)

    async def _create(
        self,
        client: Client,
        given: CreateRequest,
        key: idempotency.Key | None,
        input_param: str,
        item_names: list[str] | None,
        param: toolcheck.Param,
        compact_over: int | None,
        resolved: model_cache.Resolved | None,
    ) -> response_store.Created:
        """:meth:`create` with the model's record as the cache resolved it (``None``:
        no model of that name, refused by :meth:`prepare`); :class:`model_cache.Changed`
        when its transaction finds the record changed since."""
        secret = given.mcp_headers  # MCP header values: stored apart
        request, record = await self.prepare(
            client,
            given,
            input_param,
            item_names=item_names,
            param=param,
            record=None if resolved is None else resolved.record,
        )
        model = record.id  # an alias runs as the model it names
        if compact_over is not None and not await self._replays(key):
            request = await compaction.compact_request(self, client, record, request, compact_over)
        # a prompt the context cannot hold is refused now, when its length can be known
        # (or, with truncation "auto", its oldest items are dropped until it fits)
        size, request = await self.read(self._fit, record, request)
        if size is not None and size.tokens >= size.context:
            has = str(size.tokens) if size.whole else f"at least {size.tokens}"
            raise errors.LmspError(
                "context_length_exceeded",
                f"The prompt has {has} tokens; the context of {model!r} holds {size.context}."
                + _context_advice(request, input_param),
                param=input_param,
            )
        if resolved is None:  # it names a model now, added since the cache looked
            raise model_cache.Changed(given.model)
        pending = self.db.submit(self._job(client, request, key, secret, resolved))
        # a waiting worker's claim, in the same commit; it begins the first turn meanwhile
        claim = self.runner.claim_beside(early.FirstTurn(request, record, pending))
        created: response_store.Created = await asyncio.wrap_future(pending)
        return await self._created(model, created, taken_by_claim(claim, created))

    def _job(
        self,
        client: Client,
        request: PreparedRequest,
        key: idempotency.Key | None,
        secret: dict[str, dict[str, str]],
        resolved: model_cache.Resolved,
    ) -> Callable[[Conn], response_store.Created]:
        """The write that creates a prepared request's response and task, under the
        model record it was prepared with (:func:`model_cache.check`)."""
        previous = request.previous_response_id
        conversation = request.conversation.id if request.conversation is not None else None

        def job(conn: Conn) -> response_store.Created:
            # revoked while its files were read (seconds): no task, no 202
            client_store.ensure_active(conn, client.id)
            model_cache.check(conn, resolved)  # deleted or changed meanwhile: again
            if previous is not None:  # still there (not deleted or swept meanwhile)
                response_store.continuable(conn, previous, client.id)
            created = response_store.create(
                conn,
                client_id=client.id,
                request=request,
                on_restart=request.on_restart or self.settings.default_on_restart,
                max_queue=self.settings.max_queue,
                key=key,
            )
            if conversation is not None and not created.replayed:  # its turn goes there
                conversation_store.bind(
                    conn, created.response_id, conversation, client, self.quota, request.input
                )
            if secret and not created.replayed:
                mcp_headers.keep(conn, created.response_id, secret)
            return created

        return job

    async def prepare(
        self,
        client: Client,
        given: CreateRequest,
        input_param: str = "input",
        *,
        item_names: list[str] | None = None,
        param: toolcheck.Param = toolcheck.responses_param,
        record: models.ModelRecord | None = None,
    ) -> tuple[PreparedRequest, models.ModelRecord]:
        """What :meth:`create` checks and resolves before it counts the prompt: the model,
        the sampling numbers, schemas and grammars, every input item (files read), that
        ``conversation`` may take the turn (its quotas) and ``previous_response_id`` may
        be continued: the prepared request (either history is read by :meth:`fit`, only
        as far as the context holds it) and the model's record (``record``: the one
        ``given.model`` resolved to, when the caller has it).
        ``/v1/responses/input_tokens`` counts what this gives."""
        # the budget of its files and schemas, all together, counted from now
        ticket = Ticket.arriving(client.id, self.settings.request_cpu_time, WALL_FACTOR)
        if given.service_tier == "priority" and not client.allows("priority"):
            raise errors.forbidden("priority")  # the priority tier needs its scope
        if record is None:  # (a create's comes from the cache: app/model_cache.py)
            record = await self.model(given.model, client)
        # the sampling numbers it runs with: its own, else the model's defaults, else lmsp's
        sampling = stored_request.sampling_used(given, record.defaults)
        # schemas and grammar compiled once, in a worker, under their budget
        given = await toolcheck.check_grammar(self.grammars, given, param, ticket)
        if self.host.holds_json(record) and not self.host.constrains(record):
            toolcheck.refuse_beyond_json(given, record.id, param)
        elif not self.host.constrains(record):
            toolcheck.refuse_constraints(given, record.id, param)
        # every input item checked (once), and each file read as text once, before any write
        checked = given.input
        if given.given is not None:
            normalize = functools.partial(
                items.normalize,
                given.given,
                capabilities=models.capabilities(record),
                param=input_param,
                compaction_key=self.compaction_key,
            )
            # a string is one message, made at once; a list of items is checked in a worker
            plain = isinstance(given.given, str)
            checked = itemtypes.typed(normalize() if plain else await asyncio.to_thread(normalize))
        names = item_names or []

        def name(index: int) -> str:
            return names[index] if index < len(names) else f"{input_param}.{index}"

        checked = await self.files.with_texts(checked, name, ticket)
        previous = given.previous_response_id
        if previous is not None:  # its history is read when it is counted (:meth:`fit`)
            await self.read(
                lambda: response_store.continuable(self.db.reader(), previous, client.id)
            )
        upto = None
        if given.conversation is not None:  # the request names its last item (read by fit)
            conversation = given.conversation.id
            upto = await self.read(
                lambda: conversation_store.start(
                    self.db.reader(), conversation, client, self.quota, checked
                )
            )
        # a tool output answers a call of the input or of the history it continues
        started = None if given.conversation is None or upto is None else (conversation, upto)
        if toolresults.unanswered(checked):  # its history is read only for these
            await self.read(
                lambda: toolresults.check(self.db.reader(), checked, previous, started, name)
            )
        request = stored_request.prepared(
            given, checked, model=record.id, conversation_upto=upto, **sampling
        )
        return request, record

    async def _replays(self, key: idempotency.Key | None) -> bool:
        """Whether ``key`` was used already (its create replays: no compaction first)."""
        if key is None:
            return False
        stored = await self.db.write(lambda c: idempotency.lookup(c, key))
        return stored is not None

    async def _created(
        self, model: str, created: response_store.Created, claimed: bool = False
    ) -> response_store.Created:
        """``claimed``: the claim beside its write took its task (no worker to wake)."""
        if not created.replayed:
            if not claimed:
                self.runner.notify()
            log.info(
                "response %s queued as task %s",
                created.response_id,
                created.task_id,
                extra={
                    "event": "response.created",
                    "response_id": created.response_id,
                    "task_id": created.task_id,
                    "model": model,
                },
            )
        elif created.status_code != 202:
            task = await self.read(lambda: task_store.get(self.db.reader(), created.task_id))
            if task is not None and not task.status.terminal:
                raise errors.LmspError(
                    "idempotency_request_in_progress",
                    "A request with this Idempotency-Key is still being processed.",
                )
        return created


def taken_by_claim(
    claim: concurrent.futures.Future[Taken | None] | None, created: response_store.Created
) -> bool:
    """Did ``claim`` (:meth:`Runner.claim_beside`, committed with the create or after it)
    take the created task? ``False`` while it is not answered yet: a worker is woken then,
    as it is when the claim took an older task."""
    if claim is None or not claim.done() or claim.cancelled() or claim.exception() is not None:
        return False
    taken = claim.result()
    return taken is not None and taken[0].id == created.task_id
