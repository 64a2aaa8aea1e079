"""The running service: settings, database, model host, runner and broker, and the
operations the routes share."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lmsp import datadir, errors
from lmsp.api.refusals import Refusals
from lmsp.api.sessions import ConsoleSessions
from lmsp.api.tokens import TokenCache
from lmsp.app import compaction, embedwork, fitting, toolcheck, toolresults
from lmsp.app.broker import Broker
from lmsp.app.files import FileReader
from lmsp.cluster.nodes import Membership
from lmsp.cluster.startup import HeadStart, head_start
from lmsp.config import Settings
from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.host import ModelHost
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.fairgate import Ticket
from lmsp.metrics import Metrics
from lmsp.outbound.deliverer import Deliverer, DeliveryPolicy
from lmsp.outbound.pull import Downloader
from lmsp.protocol import items, itemtypes
from lmsp.protocol import request as stored_request
from lmsp.protocol.itemtypes import InputItem
from lmsp.protocol.request import CreateRequest, PreparedRequest
from lmsp.protocol.states import Status
from lmsp.protocol.webhooks import parse_hosts
from lmsp.runner import recovery, retention
from lmsp.runner.plan import messages_of, tools_of
from lmsp.runner.runner import Runner
from lmsp.sandbox import WALL_FACTOR, Sandbox
from lmsp.store import aliases, idempotency, mcp_headers, models
from lmsp.store import clients as client_store
from lmsp.store import conversations as conversation_store
from lmsp.store import responses as response_store
from lmsp.store import service as config_store
from lmsp.store import tasks as task_store
from lmsp.store import usage as usage_store
from lmsp.store.clients import Client
from lmsp.store.db import Database
from lmsp.store.sql import Conn, Row

log = logging.getLogger("lmsp")

P = ParamSpec("P")
T = TypeVar("T")
# threads that run the API's database reads, so the event loop never waits on SQLite
READERS = 4


def model_not_found(model: str, known: list[str] | None = None) -> errors.LmspError:
    """``404 model_not_found``, the same on every route: what to do, and the models
    there are (``known``, when the client may list them)."""
    message = (
        f"The model {model!r} does not exist. Name a model of this server, or make"
        f" {model!r} an alias of one (lmsp models alias {model} MODEL)."
    )
    if known is not None:
        message += f" The models here: {', '.join(known) or 'none'}."
    return errors.LmspError("model_not_found", message, param="model")


def _context_advice(request: PreparedRequest, input_param: str) -> str:
    """What a client whose prompt does not fit can do, in the terms of its API: only
    ``/v1/responses`` has ``truncation``."""
    if request.truncation == "auto":
        return " Even its last input item alone does not fit."
    larger = " or serve the model with a larger context (LMSP_N_CTX)."
    if input_param == "input":
        return ' truncation: "auto" drops the oldest input items to fit;' + larger
    return f" Send a shorter {input_param} (fewer or shorter items),{larger}"


@dataclass
class Service:
    settings: Settings
    db: Database
    host: ModelHost
    runner: Runner
    service_id: str
    recovered: recovery.Report
    metrics: Metrics = field(default_factory=Metrics)
    kv: PrefixFiles | None = None  # the durable prefix cache; swept with retention
    console: ConsoleSessions = field(default_factory=ConsoleSessions)
    started_at: int = field(default_factory=lambda: int(time.time()))
    broker: Broker | None = None
    # this node's lease and rescuer on a database nodes share (None: SQLite, one node)
    membership: Membership | None = None
    # client id → when this process last recorded its use (``last_used_at`` writes)
    touched: dict[str, int] = field(default_factory=dict)
    # the webhook sender (docs/webhooks.md), started and stopped with the app
    webhooks: Deliverer | None = None
    # when each webhook's last test was sent (POST …/test: one a second per webhook)
    webhook_tests: dict[str, float] = field(default_factory=dict)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # the recent 4xx/5xx answers, for ``lmsp logs --errors``
    refusals: Refusals = field(default_factory=Refusals)
    tokens: TokenCache = field(init=False)
    readers: ThreadPoolExecutor = field(init=False)
    # untrusted input (schemas, files) is compiled and read in worker processes
    sandbox: Sandbox = field(init=False)
    grammars: GrammarBudget = field(init=False)
    files: FileReader = field(init=False)
    # the key of compaction items' HMAC (the database's: every node checks alike)
    compaction_key: bytes = field(init=False, repr=False)
    # how much a conversation, and a client's conversations, may hold
    quota: conversation_store.Quota = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = TokenCache(self.db)
        self.compaction_key = self.db.write_sync(config_store.compaction_key)
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="lmsp-read")
        settings = self.settings
        self.sandbox = Sandbox(settings.input_workers, memory_bytes=settings.input_memory)
        self.grammars = GrammarBudget(
            self.sandbox, cpu_seconds=settings.schema_cpu_time, max_bytes=settings.max_schema_bytes
        )
        self.files = FileReader(self.sandbox, cpu_seconds=settings.file_cpu_time)
        self.quota = conversation_store.Quota(
            settings.conversation_max_items,
            settings.conversation_max_bytes,
            settings.client_conversation_bytes,
        )

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a reader thread (its ``db.reader()`` is that
        thread's connection): the event loop goes on serving meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.readers, functools.partial(fn, *args, **kwargs))

    def close_readers(self) -> None:
        self.readers.shutdown(wait=True)
        self.sandbox.close()

    # -- lookups (404 for what the client does not own; ``admin`` sees everything) ---------
    def owned_response(self, response_id: str, client: Client) -> tuple[Row, Row]:
        conn = self.db.reader()
        response = task_store.get_response(conn, response_id)
        if response is None or not client.oversees(response["client_id"]):
            raise errors.not_found("response", response_id)
        task = task_store.of_response(conn, response_id)
        if task is None:  # deleted between the two reads
            raise errors.not_found("response", response_id)
        return response, task

    def owned_task(self, task_id: str, client: Client) -> Row:
        task = task_store.get(self.db.reader(), task_id)
        if task is None or not client.oversees(task["client_id"]):
            raise errors.not_found("task", task_id)
        return task

    def response_object(self, task_id: str) -> dict[str, Any]:
        conn = self.db.reader()
        task = task_store.get(conn, task_id)
        if task is None:
            raise errors.not_found("task", task_id)
        return task_store.render_response(conn, task)

    async def model(self, name: str, client: Client) -> models.ModelRecord:
        """The model ``name`` names (its id or an alias), or ``404 model_not_found``."""
        record = await self.read(lambda: aliases.resolve(self.db.reader(), name))
        if record is not None:
            return record
        known = None
        if client.allows("models:read"):
            known = await self.read(lambda: [m.id for m in models.all_models(self.db.reader())])
        raise model_not_found(name, known)

    # -- shared operations -----------------------------------------------------------------
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
        secret = given.mcp_headers  # MCP header values: stored apart
        request, record = await self.prepare(
            client, given, input_param, item_names=item_names, param=param
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
        return await self._created(
            model, await self.db.write(self._job(client, request, key, secret))
        )

    def _job(
        self,
        client: Client,
        request: PreparedRequest,
        key: idempotency.Key | None,
        secret: dict[str, dict[str, str]],
    ) -> Callable[[Conn], response_store.Created]:
        """The write that creates a prepared request's response and task."""
        model, previous = request.model, request.previous_response_id
        conversation = request.conversation.id if request.conversation is not None else None

        def job(conn: Conn) -> response_store.Created:
            # revoked while its files were read (seconds): no task, no 202
            client_store.ensure_active(conn, client.id)
            if models.get(conn, model) is None:  # deleted meanwhile
                raise model_not_found(model)
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
    ) -> tuple[PreparedRequest, models.ModelRecord]:
        """What :meth:`create` checks and resolves before it counts the prompt: the model,
        the sampling numbers, schemas and grammars, every input item (files read), that
        ``conversation`` may take the turn (its quotas) and ``previous_response_id`` may
        be continued: the prepared request (either history is read by :meth:`fit`, only
        as far as the context holds it) and the model's record.
        ``/v1/responses/input_tokens`` counts what this gives."""
        # the budget of its files and schemas, all together, counted from now
        ticket = Ticket.arriving(client.id, self.settings.request_cpu_time, WALL_FACTOR)
        if given.service_tier == "priority" and not client.allows("priority"):
            raise errors.forbidden("priority")  # the priority tier needs its scope
        record = await self.model(given.model, client)
        # the sampling numbers it runs with: its own, else the model's defaults, else lmsp's
        sampling = stored_request.sampling_used(given, record.defaults)
        # schemas and grammar compiled once, in a worker, under their budget
        given = await toolcheck.check_grammar(self.grammars, given, param, ticket)
        engine = self.host.engines.get(record.engine)
        if engine is not None and not engine.constrains:
            toolcheck.refuse_constraints(given, record.id, param)
        # every input item checked (once), and each file read as text once, before any write
        checked = given.input
        if given.given is not None:
            checked = itemtypes.typed(
                await asyncio.to_thread(
                    items.normalize,
                    given.given,
                    capabilities=models.capabilities(record),
                    param=input_param,
                    compaction_key=self.compaction_key,
                )
            )
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

    async def _created(self, model: str, created: response_store.Created) -> response_store.Created:
        if not created.replayed:
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
            if task is not None and not Status(task["status"]).terminal:
                raise errors.LmspError(
                    "idempotency_request_in_progress",
                    "A request with this Idempotency-Key is still being processed.",
                )
        return created

    def cancel_nowait(self, task_id: str) -> None:
        """Cancel from a context that cannot await (a stream whose client left)."""
        future = self.db.submit(lambda c: task_store.cancel(c, task_id))

        def done(f: Future[Any]) -> None:
            if f.exception() is None:
                self._after_cancel(task_id, f.result())
            else:  # e.g. a full disk: the task runs on, as if the client had stayed
                log.warning("cancel of %s after a disconnect failed: %s", task_id, f.exception())

        future.add_done_callback(done)

    async def cancel(self, task_id: str, wait: float = 0.0) -> None:
        """Cancel; when the runner has to stop generating, wait up to ``wait`` seconds
        for it to have stopped (so the answer normally shows ``cancelled``)."""
        moved = await self.db.write(lambda c: task_store.cancel(c, task_id))
        if moved is not None:
            log.info(
                "task %s: cancel requested",
                task_id,
                extra={"event": "task.cancel_requested", "task_id": task_id},
            )
        self._after_cancel(task_id, moved)
        if moved is not None and moved["status"] == Status.CANCELLING and wait > 0:
            await self.wait_finished(task_id, timeout=wait)

    def cancelled(self, moved: list[Row], why: str) -> None:
        """After a commit that cancelled tasks (a revoke): the runner stops generating
        for those now ``cancelling``."""
        for task in moved:
            log.info(
                "task %s: cancel requested (%s)",
                task["id"],
                why,
                extra={"event": "task.cancel_requested", "task_id": task["id"]},
            )
            self._after_cancel(task["id"], task)

    async def delete_when_finished(self, task_id: str, response_id: str, client_id: str) -> None:
        """``store: false``: the response goes once its task has finished."""
        await self.wait_finished(task_id)
        await self.db.write(lambda c: response_store.delete(c, response_id, client_id))

    def forget_later(self, task_id: str, response_id: str, client_id: str) -> None:
        """:meth:`delete_when_finished` from a context that cannot await."""
        job = asyncio.get_running_loop().create_task(
            self.delete_when_finished(task_id, response_id, client_id)
        )
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    def _after_cancel(self, task_id: str, moved: Row | None) -> None:
        if moved is not None and moved["status"] == Status.CANCELLING:
            self.runner.request_cancel(task_id)

    async def wait_finished(self, task_id: str, timeout: float | None = None) -> bool:
        """Wait until the task is finished (or gone); ``False`` if ``timeout`` passed."""
        assert self.broker is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: int | None = None
        while True:
            waiter = self.broker.current()
            stamp = self.db.versions.task(task_id)  # unchanged task: no read
            if stamp is None or stamp != seen:
                task = await self.read(lambda: task_store.get(self.db.reader(), task_id))
                if task is None or Status(task["status"]).terminal:
                    return True
                seen = stamp
            left = 10.0 if deadline is None else min(10.0, deadline - time.monotonic())
            if left <= 0:
                return False
            await self.broker.wait(waiter, left)

    async def collect_garbage(self) -> retention.Swept:
        return await asyncio.to_thread(
            retention.sweep,
            self.db,
            self.settings.retention,
            kv=self.kv,
            conversations=self.settings.conversation_retention or None,
        )


def open_service(
    settings: Settings, lock: datadir.DataDirLock | None = None, head: HeadStart | None = None
) -> Service:
    """Open the data directory, join the cluster if there is one and run startup
    recovery (blocking), or take over ``head``, which ``lmsp serve`` did all that with
    before its imports (:mod:`lmsp.cluster.startup`). Closing ``db`` releases the lock;
    :class:`lmsp.datadir.DataDirBusy` if another process holds it."""
    if head is None:
        head = head_start(settings, lock)
    db, host, metrics, service_id = head.db, head.host, head.metrics, head.service_id
    report, membership = head.report, head.membership
    log.info(
        "recovered: %d failed, %d cancelled, %d requeued, %d resumed",
        len(report.failed),
        len(report.cancelled),
        len(report.requeued),
        len(report.resumed),
    )
    metrics.recovered(report.outcomes)
    runner = Runner(
        db,
        host,
        parallel=settings.parallel,
        reserved=settings.reserved_sequences,
        flush_interval=settings.flush_interval,
        metrics=metrics,
    )
    runner.pulls = Downloader(
        db,
        settings.data_dir,
        settings.hf_endpoint,
        settings.hf_token,
        node=settings.node if db.shared else "",
        metrics=metrics,
    )
    if membership is not None:
        membership.attach(runner)
        membership.start()  # the lease is renewed from now on (it ends with the database)
        db.on_task_change(runner.heard)
    metrics.add_collector(lambda: database_figures(db))
    metrics.add_collector(lambda: engine_figures(host))
    metrics.add_collector(lambda: usage_figures(db))
    metrics.add_collector(lambda: embedwork.engine_figures(host))
    service = Service(settings, db, host, runner, service_id, report, metrics, kv=host.prefix_files)
    service.membership = membership
    runner.grammars = service.grammars  # an MCP loop's schemas: the API's budget
    policy = DeliveryPolicy(
        settings.webhook_retry, settings.webhook_give_up, parse_hosts(settings.webhook_hosts)
    )
    service.webhooks = Deliverer(db, policy, settings.node if db.shared else None)
    return service


def engine_figures(host: ModelHost) -> list[Metric]:
    """Each model's engine process: its pid while it runs, and whether its crash loop
    marked the model failed."""
    pid = GaugeMetricFamily(
        "lmsp_engine_pid", "The process id of a model's engine.", labels=["model"]
    )
    failed = GaugeMetricFamily(
        "lmsp_engine_failed",
        "1 when a model's engine crashed too often and is not started again.",
        labels=["model"],
    )
    for status in host.engine_status():
        if status["pid"] is not None:
            pid.add_metric([status["model"]], status["pid"])
        failed.add_metric([status["model"]], 1 if status["state"] == "failed" else 0)
    return [pid, failed]


def database_figures(db: Database) -> list[Metric]:
    """The figures that live in the database, read when ``/metrics`` is scraped."""
    conn = db.reader()
    by_status = GaugeMetricFamily(
        "lmsp_tasks", "Tasks stored, by status (finished ones until retention).", labels=["status"]
    )
    counts = task_store.status_counts(conn)
    for status in Status:
        by_status.add_metric([status.value], counts.get(status.value, 0))
    queue = GaugeMetricFamily("lmsp_queue_depth", "Tasks queued, waiting for a runner slot.")
    queue.add_metric([], counts.get(Status.QUEUED.value, 0))
    return [by_status, queue]


def usage_figures(db: Database) -> list[Metric]:
    """Each client's requests and tokens, from the usage ledger (durable: a restart
    does not reset these counters)."""
    names = {
        "requests": "Finished requests of a client (its embeddings requests included).",
        "input_tokens": "Prompt tokens of a client's finished requests (and embedded tokens).",
        "cached_tokens": "Prompt tokens read from a cached prefix.",
        "output_tokens": "Generated tokens of a client's finished requests.",
    }
    families = {
        key: CounterMetricFamily(f"lmsp_client_{key}", text, labels=["client_id", "client"])
        for key, text in names.items()
    }
    for row in usage_store.totals_by_client(db.reader()):
        for key, family in families.items():
            family.add_metric([row["client_id"], row["name"] or ""], int(row[key] or 0))
    return list(families.values())
