"""The first part of a start: the data directory opened and recovered, and the engines
its unfinished tasks will run already loading.

After a crash the next token of a resumed task waits for its model's engine: a fresh
process that loads the model and creates its context (about a second here). That wait
should overlap everything else a start does, the API process's own imports (most of
another second) included. So ``lmsp serve`` calls :func:`head_start` before it imports
the HTTP application: the database is opened and bootstrapped, the node joins its
cluster if there is one, startup recovery runs (chapter 11.3: still before the listener
accepts), and the engines of the models the tasks recovery left unfinished will run are
launched (:meth:`~lmsp.engines.host.ModelHost.warm`; none for the tasks it failed, as
``on_restart: fail``, the default, does with every task a crash interrupted). The
application's startup then takes the :class:`HeadStart` over (``open_service``). Tests
that build the application alone get the same steps, in one go.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lmsp import datadir, gguf
from lmsp.bootstrap import bootstrap
from lmsp.cluster.nodes import Membership
from lmsp.config import Settings
from lmsp.engines.base import LoadOptions, Tokenizer
from lmsp.engines.deterministic import DeterministicEngine
from lmsp.engines.host import ModelHost
from lmsp.engines.kind import Engine
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_cpp import LlamaEngine
from lmsp.engines.reattach import Registry
from lmsp.engines.remote import RemoteEngine
from lmsp.metrics import Metrics
from lmsp.runner import recovery
from lmsp.store import blobs, models
from lmsp.store.db import Database
from lmsp.store.open import open_database


@dataclass
class HeadStart:
    """An opened, bootstrapped and recovered data directory and its model host, the
    engines of unfinished tasks loading."""

    db: Database
    metrics: Metrics
    host: ModelHost
    service_id: str
    report: recovery.Report
    membership: Membership | None = None  # joined, not yet renewing its lease

    def close(self) -> None:
        """Undo it (the start did not go on): engines stopped, the database closed."""
        try:
            self.host.close()
        finally:
            self.db.close()


def engines() -> dict[str, Engine]:
    return {"llama_cpp": LlamaEngine(), "test": DeterministicEngine(), "remote": RemoteEngine()}


def head_start(
    settings: Settings,
    lock: datadir.DataDirLock | None = None,
    prepared: Prepared | None = None,
) -> HeadStart:
    """Take the data directory's lock (unless the caller holds it already), open and
    bootstrap it, join the cluster, recover, and launch the engines the unfinished
    tasks will need. :class:`lmsp.datadir.DataDirBusy` if another process holds the
    lock."""
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
        membership: Membership | None = None
        if db.shared:  # one of several nodes: join (a new lease epoch), then recover
            membership = Membership(
                db, settings.node, f"{settings.host}:{settings.port}", settings.lease_ttl
            )
            membership.join()
        # a node recovers what it held itself (on a shared database, other nodes' tasks
        # are theirs, and their rescuers' once their lease runs out)
        report = recovery.recover(db, settings.node if db.shared else None)
        host = open_host(settings, db, metrics, prepared)
    except BaseException:
        db.close()
        raise
    # the models the recovered tasks will run load while everything else starts
    host.warm(models.awaited(db.reader()))
    return HeadStart(db, metrics, host, service_id, report, membership)


def open_host(
    settings: Settings,
    db: Database,
    metrics: Metrics,
    prepared: Prepared | None = None,
) -> ModelHost:
    """The model host, its prefix cache the relief of a full disk, and what a standby
    :func:`prepare`-d ahead."""
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
        in_thread=settings.in_thread_engines,
        max_restarts=settings.engine_restarts,
        restart_window=settings.engine_restart_window,
        log_format=settings.log_format,
        load=load_options(settings, kv),
        registry=(
            Registry(settings.data_dir / "engines", settings.engine_orphan_timeout)
            if settings.engine_orphan_timeout > 0
            else None
        ),
        spares=settings.spare_engine,
        tokenizers=prepared.tokenizers if prepared else None,
        verified=prepared.verified if prepared else frozenset(),
    )
    host.metrics = metrics
    return host


def load_options(settings: Settings, kv: PrefixFiles | None) -> LoadOptions:
    """How every engine loads (its model's digest and upstream are added per model)."""
    return LoadOptions(
        sequences=settings.parallel + settings.reserved_sequences,
        prefix_files=kv,
        embed_tokens=settings.embed_max_tokens,
        exact=settings.exact,
        kv_budget=settings.kv_budget,
        embed_share=settings.embed_share,
        rope_scaling=settings.rope_scaling,
        nice=settings.engine_nice,
    )


@dataclass(frozen=True)
class Prepared:
    """What a standby makes while it waits, so that its first resume after the takeover
    neither reads a vocabulary (a fifth of a second each) nor hashes a blob (about
    0.1 s for the bundled model): the tokenizer of every local GGUF model in the blob
    store, and the digests of the blobs it hashed, both by digest."""

    tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    verified: frozenset[str] = frozenset()


def prepare(settings: Settings) -> Prepared:
    """:class:`Prepared` for the data directory's blob store, made as the model host
    makes them: each whole GGUF blob hashed (as a process's first load of it would) and
    its tokenizer made. Read only: no lock is needed; a blob that is no GGUF, or a part
    of a split model (its parts load together, under the names the model host links
    them by), is passed over: checked and made at first use as before."""
    engine = LlamaEngine()
    found: dict[str, Tokenizer] = {}
    verified: set[str] = set()
    for path in sorted(settings.blobs_dir.glob("sha256-*")):
        digest = f"sha256:{path.name.removeprefix('sha256-')}"
        try:
            if int(gguf.read_header(path).get("split.count", 1)) > 1:
                continue
            if blobs.hash_file(path)[0] == digest:
                verified.add(digest)
            options = replace(load_options(settings, None), digest=digest)
            found[digest] = engine.tokenizer(path, settings.n_ctx, options)
        except Exception:
            continue
    return Prepared(found, frozenset(verified))
