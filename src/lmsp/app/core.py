"""The running service's parts, which every use case works with: the settings, the
database, the model host, the runner, the broker, the webhook sender, and the budgets
and readers of untrusted input. Built and wired by :mod:`lmsp.app.root`; nothing in
here knows HTTP."""

from __future__ import annotations

import asyncio
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from lmsp.app.broker import Broker
from lmsp.app.files import FileReader
from lmsp.app.model_cache import ModelCache
from lmsp.cluster.nodes import Membership
from lmsp.config import Settings
from lmsp.constraints.budget import GrammarBudget
from lmsp.engines.host import ModelHost
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.metrics import Metrics
from lmsp.outbound.deliverer import Deliverer
from lmsp.protocol.request import CreateRequest
from lmsp.runner import recovery
from lmsp.runner.runner import Runner
from lmsp.sandbox import Sandbox
from lmsp.store import conversations as conversation_store
from lmsp.store import idempotency
from lmsp.store import responses as response_store
from lmsp.store import service as config_store
from lmsp.store.clients import Client
from lmsp.store.db import Database

P = ParamSpec("P")
T = TypeVar("T")
# threads that run the API's database reads, so the event loop never waits on SQLite
READERS = 4


@dataclass
class Core(ABC):
    settings: Settings
    db: Database
    host: ModelHost
    runner: Runner
    service_id: str
    recovered: recovery.Report
    metrics: Metrics = field(default_factory=Metrics)
    kv: PrefixFiles | None = None  # the durable prefix cache; swept with retention
    started_at: int = field(default_factory=lambda: int(time.time()))
    broker: Broker | None = None
    # this node's lease and rescuer on a database nodes share (None: SQLite, one node)
    membership: Membership | None = None
    # client id → when this process last recorded its use (``last_used_at`` writes)
    touched: dict[str, int] = field(default_factory=dict)
    # the webhook sender (docs/webhooks.md), started and stopped with the service
    webhooks: Deliverer | None = None
    # when each webhook's last test was sent (one a second per webhook)
    webhook_tests: dict[str, float] = field(default_factory=dict)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    readers: ThreadPoolExecutor = field(init=False)
    # untrusted input (schemas, files) is compiled and read in worker processes
    sandbox: Sandbox = field(init=False)
    grammars: GrammarBudget = field(init=False)
    files: FileReader = field(init=False)
    # the key of compaction items' HMAC (the database's: every node checks alike)
    compaction_key: bytes = field(init=False, repr=False)
    # how much a conversation, and a client's conversations, may hold
    quota: conversation_store.Quota = field(init=False)
    # the model records creates resolve (app/model_cache.py)
    model_cache: ModelCache = field(init=False)

    def __post_init__(self) -> None:
        self.compaction_key = self.db.write_sync(config_store.compaction_key)
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="lmsp-read")
        self.model_cache = ModelCache(self.db)
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

    def later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (from a context that cannot await), held
        until it ends."""
        job = asyncio.get_running_loop().create_task(work)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    @property
    def node(self) -> str:
        """This node's name when nodes share the database, else ``""`` (one node)."""
        return self.settings.node if self.db.shared else ""

    def close_readers(self) -> None:
        self.readers.shutdown(wait=True)
        self.sandbox.close()

    @abstractmethod
    async def create(
        self, client: Client, given: CreateRequest, key: idempotency.Key | None
    ) -> response_store.Created:
        """Persist a response and its task: the create use case
        (:class:`lmsp.app.service.Service`), which compaction calls back for the
        summary it has the model write."""
