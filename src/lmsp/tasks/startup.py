"""The first part of a start: the data directory opened and the engines of unfinished
tasks already loading.

After a crash the next token of a resumed task waits for its model's engine: a fresh
process that loads the model and creates its context (about a second here). That wait
should overlap everything else a start does, the API process's own imports (most of
another second) included. So ``lmsp serve`` calls :func:`head_start` before it imports
the HTTP application: the database is opened and bootstrapped, the model host made,
and the engines of the models unfinished tasks will run are launched
(:meth:`~lmsp.engines.host.ModelHost.warm`). The application's startup then takes the
:class:`HeadStart` over (``open_service``), joins the cluster if there is one, and
recovers. Tests that build the application alone get the same steps, in one go.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmsp import datadir
from lmsp.bootstrap import bootstrap
from lmsp.config import Settings
from lmsp.engines.base import Engine
from lmsp.engines.host import ModelHost
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_cpp import LlamaEngine
from lmsp.engines.test_engine import TestEngine
from lmsp.metrics import Metrics
from lmsp.store import models
from lmsp.store.db import Database
from lmsp.store.open import open_database


@dataclass
class HeadStart:
    """An opened, bootstrapped data directory and its model host, engines loading."""

    db: Database
    metrics: Metrics
    host: ModelHost
    service_id: str

    def close(self) -> None:
        """Undo it (the start did not go on): engines stopped, the database closed."""
        try:
            self.host.close()
        finally:
            self.db.close()


def engines() -> dict[str, Engine]:
    return {"llama_cpp": LlamaEngine(), "test": TestEngine()}


def head_start(settings: Settings, lock: datadir.DataDirLock | None = None) -> HeadStart:
    """Take the data directory's lock (unless the caller holds it already), open and
    bootstrap it, make the model host and launch the engines unfinished tasks will
    need. :class:`lmsp.datadir.DataDirBusy` if another process holds the lock."""
    if lock is None:
        lock = datadir.acquire(settings.data_dir)
    try:
        db = open_database(settings, lock)
    except BaseException:
        lock.release()
        raise
    try:
        metrics = Metrics()
        db.metrics = metrics
        service_id = bootstrap(
            db, settings.data_dir, settings.blobs_dir, settings.enable_test_engine
        )
        host = open_host(settings, db, metrics)
    except BaseException:
        db.close()
        raise
    # the models unfinished tasks will run load while everything else starts
    host.warm(models.awaited(db.reader()))
    return HeadStart(db, metrics, host, service_id)


def open_host(settings: Settings, db: Database, metrics: Metrics) -> ModelHost:
    """The model host, its prefix cache the relief of a full disk."""
    kv = PrefixFiles(
        settings.kv_dir,
        max_bytes=settings.kv_cache_bytes,
        ttl=settings.kv_cache_ttl,
        reserve=settings.kv_cache_reserve,
    )
    db.relief = kv.relieve  # a write that finds the disk full first empties the cache
    host = ModelHost(
        settings.blobs_dir,
        engines(),
        settings.n_ctx,
        keep_alive=settings.keep_alive,
        max_loaded=settings.max_loaded_models,
        sequences=settings.parallel + settings.reserved_sequences,
        prefix_files=kv,
        in_thread=settings.in_thread_engines,
        max_restarts=settings.engine_restarts,
        restart_window=settings.engine_restart_window,
        log_format=settings.log_format,
        embed_tokens=settings.embed_max_tokens,
        exact=settings.exact,
        kv_budget=settings.kv_budget,
        embed_share=settings.embed_share,
        rope_scaling=settings.rope_scaling,
    )
    host.metrics = metrics
    return host
