"""Which engine runs a model record, whether its blob is intact, which models are
loaded, and the supervision of their engine processes.

Before a blob is handed to an engine it is checked against its record: the size every
time, the full SHA-256 the first time this process uses it. A loaded model is one engine
process (:class:`~lmsp.engines.client.EngineClient`, as ollama's runners are) whose
``sequences`` sequences the runner's slots step together. Loaded models stay for
``keep_alive`` seconds after their last use and are stopped sooner when another model
needs the memory: at most ``max_loaded`` models are loaded at once.

An engine process that dies (a segfault, ``kill -9``, out of memory) is started again at
once, and its tasks follow their ``on_restart`` policy (the runner sees
:class:`~lmsp.engines.base.EngineCrashed`). An engine that keeps dying is not restarted
forever: after ``max_restarts`` restarts within ``restart_window`` seconds, the next
crash marks its model failed — tasks on it fail with ``engine_crashed`` and a message
saying so, tasks on other models go on — until the service restarts, the model's blob
changes, or ``POST /v1/models/{id}/verify`` finds the blob intact.

Embeddings (:meth:`ModelHost.embed`) go to the same engine, which computes them in a
context of its own; while one is computed the model counts as in use (a slot of its own,
below zero, so it is not unloaded under it).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsp.engines.ahead import Ahead
from lmsp.engines.base import EngineCrashed, EngineError, LoadOptions, Tokenizer
from lmsp.engines.client import EngineClient
from lmsp.engines.hosted import EngineStatus, Loaded, Vocabularies
from lmsp.engines.kind import Engine
from lmsp.engines.reattach import Registry
from lmsp.engines.remote import constrains as remote_constrains
from lmsp.engines.remote import holds_json
from lmsp.engines.spares import SPARE_AFTER, Spares
from lmsp.engines.worker import EngineSpec
from lmsp.metrics import Metrics
from lmsp.store.blobs import blob_path, check_digest, check_size, model_path
from lmsp.store.models import ModelRecord

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["ModelHost", "blob_path"]

log = logging.getLogger(__name__)

Maker = Callable[[EngineSpec], EngineClient]


class ModelHost:
    """Loads models on demand in engines of their own, verifies their blobs, unloads idle
    ones, and restarts engines that die (see the module docstring)."""

    def __init__(
        self,
        blobs_dir: Path,
        engines: dict[str, Engine],
        n_ctx: int,
        *,
        keep_alive: float = 300.0,
        max_loaded: int = 1,
        in_thread: frozenset[str] | set[str] = frozenset(),
        max_restarts: int = 5,
        restart_window: float = 600.0,
        log_format: str = "text",
        load: LoadOptions | None = None,
        registry: Registry | None = None,
        spares: bool = False,
        tokenizers: dict[str, Tokenizer] | None = None,
        verified: frozenset[str] = frozenset(),
    ) -> None:
        self.blobs_dir = blobs_dir
        self.spares = Spares() if spares else None  # LMSP_SPARE_ENGINE (spares.py)
        self.ahead = Ahead()  # a process started ahead, for the next engine (ahead.py)
        self.registry = registry  # engines that outlive this process (reattach.py)
        self.engines = engines
        self.n_ctx = n_ctx
        self.keep_alive = keep_alive
        self.max_loaded = max(1, max_loaded)
        # how every engine loads (its sequences, saved prefixes, LMSP_EXACT …); each
        # model's own digest and upstream are added by :meth:`_options`
        given = load or LoadOptions()
        self.load = replace(given, sequences=max(1, given.sequences))
        self.in_thread = frozenset(in_thread)  # engine names run on a thread (tests)
        self.max_restarts = max(0, max_restarts)
        self.restart_window = restart_window
        self.log_format = log_format
        self._embed_slots = itertools.count(-1, -1)  # in-use marks of embeddings
        self._loaded: dict[str, Loaded] = {}  # model id → its running engine
        self._starting: set[str] = set()  # model ids whose engine is being started
        self._busy: dict[int, str] = {}  # runner slot → model id it is using
        self._cond = threading.Condition()
        self._closed = False
        self._status: dict[str, EngineStatus] = {}  # read by /healthz: its own lock
        self._status_lock = threading.Lock()
        # digests fully hashed by this process (``verified``: by it as a standby)
        self._verified: set[str] = set(verified)
        self._verify_lock = threading.Lock()
        self._vocabularies = Vocabularies(tokenizers)  # the API side's tokenizers
        self._contexts: dict[str, int] = {}  # digest → the context it would load with
        self.metrics: Metrics | None = None  # the service's: loads, unloads, crashes

    # -- what is loaded ----------------------------------------------------------------
    def is_loaded(self, model_id: str) -> bool:
        return model_id in self._loaded

    def loaded_ids(self) -> set[str]:
        return set(self._loaded)

    def loaded(self, now: float | None = None) -> list[dict[str, object]]:
        """Every loaded model: its digest, engine process, memory, whether a task uses
        it, and for an idle one the seconds until its keep-alive unloads it."""
        now = time.monotonic() if now is None else now
        with self._cond:
            entries = sorted(self._loaded.items())
            busy = set(self._busy.values())
        statuses = {s["model"]: s for s in self.engine_status()}
        return [
            entry.shown(
                self.blobs_dir,
                statuses.get(model_id, {}),
                in_use=model_id in busy,
                left=self.keep_alive - (now - entry.last_used),
            )
            for model_id, entry in entries
        ]

    def engine_status(self) -> list[dict[str, Any]]:
        """Every model's engine this service started (running, restarting, failed or
        stopped), without waiting for a load in progress."""
        with self._status_lock:
            return [s.shown() for _, s in sorted(self._status.items())]

    def _set_status(self, record: ModelRecord, **changes: Any) -> EngineStatus:
        with self._status_lock:
            status = self._status.get(record.id)
            if status is None or status.digest != record.digest:
                status = self._status[record.id] = EngineStatus(record.id, record.digest)
            for name, value in changes.items():
                setattr(status, name, value)
            return status

    # -- integrity ---------------------------------------------------------------------
    def check(self, record: ModelRecord, full: bool | None = None) -> None:
        """Raise ``EngineError('model_corrupt')`` unless the blob matches its record: by
        size always, by digest when ``full`` (default: the first time this process
        meets the digest)."""
        if record.status == "corrupt":
            raise EngineError(
                "model_corrupt",
                f"The model {record.id!r} is marked corrupt; run `lmsp models verify`.",
            )
        problem = check_size(self.blobs_dir, record)
        if problem is None and (full or (full is None and record.digest not in self._verified)):
            with self._verify_lock:
                if full or record.digest not in self._verified:
                    problem = check_digest(self.blobs_dir, record)
                    if problem is None:
                        self._verified.add(record.digest)
        if problem is not None:
            self._verified.discard(record.digest)
            raise EngineError("model_corrupt", problem)

    def verified(self, digest: str, ok: bool) -> None:
        """Record the outcome of a full check done elsewhere (``lmsp models verify``).
        An intact blob clears a crash loop's mark: its model may be started again."""
        with self._verify_lock:
            if ok:
                self._verified.add(digest)
            else:
                self._verified.discard(digest)
        if ok:
            with self._status_lock:
                for status in self._status.values():
                    if status.digest == digest and status.state == "failed":
                        status.state, status.error = "stopped", None
                        status.crash_times.clear()

    # -- loading -----------------------------------------------------------------------
    def ready(self, record: ModelRecord) -> EngineClient | None:
        """The engine :meth:`get` would hand over at once — loaded and alive with its
        blob, which this process has hashed already, not corrupt, not in a failed crash
        loop — or ``None``. A hint, changing nothing, no slot taken (the runner starts a
        fresh task in its claim's transaction when so: :meth:`lmsp.runner.runner.Runner.
        run_next`; a create's first turn begins early on it: :mod:`lmsp.runner.early`)."""
        if record.engine not in self.engines or record.status == "corrupt":
            return None
        if record.digest not in self._verified:
            return None
        with self._cond:
            entry = self._loaded.get(record.id)
            if entry is None or not entry.client.alive or entry.record.digest != record.digest:
                return None
        with self._status_lock:
            status = self._status.get(record.id)
            if status is None or status.state != "failed" or status.digest != record.digest:
                return entry.client
            return None

    def get(self, record: ModelRecord, slot: int = 0) -> EngineClient:
        """The model's engine, started once for every runner slot, marked in use by
        ``slot`` until :meth:`release`. Raises ``EngineError`` (``model_corrupt``,
        ``model_load_failed``, ``engine_crashed`` for a model its crash loop failed)
        and :class:`EngineCrashed` when the engine died while starting."""
        engine = self.engines.get(record.engine)
        if engine is None:
            raise EngineError("model_load_failed", f"No engine {record.engine!r} here.")
        self.check(record)
        self._closed = False  # a task wants it: loading works again after close()
        return self._ensure(record, engine, slot)

    def warm(self, records: list[ModelRecord]) -> threading.Thread | None:
        """Start the engines of ``records`` (as many as may be loaded at once) on a
        thread of their own, so that after a restart the models unfinished tasks will
        run load while recovery and the HTTP server start, not once a task asks. A model
        that cannot start is left to the task that asks for it (which fails with why)."""
        chosen = [r for r in records if r.engine in self.engines][: self.max_loaded]
        if not chosen:
            return None

        def load() -> None:
            for record in chosen:
                try:  # checked as it loads (see _launch)
                    self._ensure(record, self.engines[record.engine], None)
                    # a reattached engine's blob was checked by the process that loaded
                    # it: this one hashes it now, not on the way of the task's resume
                    self.check(record)
                except Exception as exc:
                    log.info("not loaded ahead: %s (%s)", record.id, exc)

        thread = threading.Thread(target=load, name="lmsp-warm", daemon=True)
        thread.start()
        return thread

    def _ensure(self, record: ModelRecord, engine: Engine, slot: int | None) -> EngineClient:
        """The running engine of ``record`` (started if need be, by this thread or by
        the one already starting it); marked in use by ``slot`` unless ``None``."""
        stopped: list[EngineClient] = []
        try:
            with self._cond:
                while True:
                    self._refuse_failed(record)
                    entry = self._loaded.get(record.id)
                    if entry is not None and not entry.client.alive:
                        self._cond.wait(0.1)  # it died: its exit is being handled
                        continue
                    if entry is not None and entry.record.digest != record.digest:
                        if any(m == record.id for m in self._busy.values()):
                            self._cond.wait(1.0)  # the id names another blob: when idle
                            continue
                        stopped += self._unload(record.id)
                        entry = None
                    if entry is not None:
                        if slot is not None:
                            self._busy[slot] = record.id
                        entry.last_used = time.monotonic()
                        return entry.client
                    if record.id in self._starting:
                        self._cond.wait(1.0)  # another thread starts it
                        continue
                    if self._closed and slot is None:
                        raise EngineError("model_load_failed", "The service is shutting down.")
                    stopped += self._make_room(record.id)
                    self._starting.add(record.id)
                    break
        finally:
            _stop(stopped)  # their memory is free before another model loads
        try:
            client = self._launch(record, engine)
        finally:
            with self._cond:
                self._starting.discard(record.id)
                self._cond.notify_all()
        with self._cond:
            late = self._closed and slot is None  # a restart the shutdown overtook
            if not late:
                self._loaded[record.id] = Loaded(record, client)
                if slot is not None:
                    self._busy[slot] = record.id
            self._cond.notify_all()
        if late:
            client.close()
            raise EngineError("model_load_failed", "The service is shutting down.")
        return client

    def _refuse_failed(self, record: ModelRecord) -> None:
        with self._status_lock:
            status = self._status.get(record.id)
            if status is None or status.state != "failed" or status.digest != record.digest:
                return
            message = status.error or "Its engine kept crashing."
        raise EngineError("engine_crashed", message)

    def _launch(self, record: ModelRecord, engine: Engine) -> EngineClient:
        """Start an engine process for ``record`` and wait for its model to load."""
        path = model_path(self.blobs_dir, record)  # a split model: its first part
        options = self._options(record)
        spec = EngineSpec(
            engine,
            path,
            self.n_ctx,
            options,
            model=record.id,
            log_format=self.log_format,
            log_level=logging.getLogger("lmsp").getEffectiveLevel(),
        )

        def make(spec: EngineSpec) -> EngineClient:
            return EngineClient(
                spec,
                in_thread=engine.name in self.in_thread,
                on_exit=lambda c, reason: self._exited(record, c, reason),
                ahead=self.ahead,
            )

        local = engine.name not in self.in_thread and record.remote is None
        registry = self.registry if local else None  # only a local engine outlives this one
        with self._status_lock:
            again = record.id in self._status
        self._set_status(record, state="restarting" if again else "starting", pid=None)
        client = None if registry is None else registry.reattach(spec, make)
        spares = self.spares if local and client is None else None
        client = client or (None if spares is None else spares.take(record))
        ready = client is not None  # reattached or a spare: its blob checked as it loaded
        try:
            if client is None:
                client = make(spec if registry is None else registry.prepare(spec))
                client.launch()
            try:  # while the engine loads: the blob's integrity, the API's tokenizer
                self.check(record, full=False if ready else None)
                client.tokenizer = self._locked_tokenizer(record, engine)
            except BaseException:
                client.stopping()
                client.close(timeout=0)  # a model that fails its check is not served
                raise
            client.wait()
        except EngineCrashed as exc:
            self._crashed(record, exc.message, restart=False)
            raise
        except EngineError:
            self._set_status(record, state="stopped", pid=None)
            raise
        except Exception as exc:  # its words (paths …) go to the log only
            self._set_status(record, state="stopped", pid=None)
            log.warning("loading %s failed: %s", record.id, exc)
            raise EngineError("model_load_failed", f"Loading {record.id!r} failed.") from exc
        if registry is not None:
            registry.record(client)
        if local and self.spares is not None:
            build = functools.partial(self._spare, record, engine, spec, make)
            self.spares.make(record, build, SPARE_AFTER)
        self._set_status(record, state="ready", pid=client.pid)
        log.info(
            "loaded %s (%d sequences, engine pid %s)",
            record.id,
            client.sequences,
            client.pid,
            extra={"event": "engine.started", "model": record.id},
        )
        if self.metrics is not None:
            self.metrics.model_loaded(record.id)
        return client

    def _spare(
        self, record: ModelRecord, engine: Engine, spec: EngineSpec, make: Maker
    ) -> EngineClient:
        """A new engine for ``record``, loaded and checked, to be held as its spare."""
        client = make(spec if self.registry is None else self.registry.prepare(spec))
        client.launch()
        try:
            self.check(record, full=False)
            client.tokenizer = self._locked_tokenizer(record, engine)
            client.wait()
        except BaseException:
            client.stopping()
            client.close(timeout=0)
            raise
        return client

    # -- engines that die --------------------------------------------------------------
    def _exited(self, record: ModelRecord, client: EngineClient, reason: str) -> None:
        """An engine ended unasked (called from its reader thread, before its streams
        hear of it): forget it, count the crash, start it again unless it keeps
        crashing."""
        with self._cond:
            entry = self._loaded.get(record.id)
            if entry is None or entry.client is not client:
                return  # it was still starting (its starter counts it) or is replaced
            del self._loaded[record.id]
            self._cond.notify_all()
        message = f"The engine process of {record.id!r} stopped unexpectedly ({reason})."
        if self._crashed(record, message, restart=True):
            engine = self.engines[record.engine]
            threading.Thread(
                target=self._restart, args=(record, engine), name="lmsp-restart", daemon=True
            ).start()

    def _crashed(self, record: ModelRecord, message: str, restart: bool) -> bool:
        """Count a crash; whether the engine may be started again (else its model is
        now failed)."""
        with self._status_lock:
            status = self._status.get(record.id)
            if status is None or status.digest != record.digest:
                status = self._status[record.id] = EngineStatus(record.id, record.digest)
            loop = not status.crashed(message, restart, self.restart_window, self.max_restarts)
        if self.metrics is not None:
            self.metrics.engine_crashed(record.id)
        if loop and self.spares is not None:
            _stop(self.spares.drop(record.id))  # a failed model needs no spare
        if loop:
            log.error(
                "model %s is failed: its engine crashed %d times within %.0f s",
                record.id,
                self.max_restarts + 1,
                self.restart_window,
                extra={"event": "engine.failed", "model": record.id},
            )
        with self._cond:
            self._cond.notify_all()  # waiters see the failure
        return not loop

    def _restart(self, record: ModelRecord, engine: Engine) -> None:
        """Start a crashed engine again (in the background: the API keeps answering)."""
        while not self._closed:
            with self._status_lock:
                status = self._status.get(record.id)
                if status is not None:
                    status.restarts += 1
            if self.metrics is not None:
                self.metrics.engine_restarted(record.id)
            try:
                self._ensure(record, engine, None)
            except EngineCrashed:
                continue  # it died while loading: counted; the crash loop bounds this
            except EngineError as exc:
                log.warning("the engine of %s did not start again: %s", record.id, exc.message)
            return

    def release(self, slot: int) -> None:
        """The slot's task is over: its model starts its keep-alive."""
        with self._cond:
            model_id = self._busy.pop(slot, None)
            entry = self._loaded.get(model_id) if model_id is not None else None
            if entry is not None:
                entry.last_used = time.monotonic()
            self._cond.notify_all()

    def _make_room(self, model_id: str) -> list[EngineClient]:
        """Unload least recently used idle models until ``model_id`` fits; wait for a
        busy one to finish when no idle one is left (called with the lock held). The
        engines to stop."""
        stopped: list[EngineClient] = []
        while True:
            others = (set(self._loaded) | self._starting) - {model_id}
            if len(others) < self.max_loaded:
                return stopped
            busy = set(self._busy.values())
            idle = [m for m in others if m not in busy and m in self._loaded]
            if idle:
                victim = min(idle, key=lambda m: self._loaded[m].last_used)
                stopped += self._unload(victim)
                log.info("unloaded %s to make room for %s", victim, model_id)
                continue
            self._cond.wait(1.0)

    def _unload(self, model_id: str) -> list[EngineClient]:
        """Forget a model's engine (called with the lock held); the caller stops it
        (:func:`_stop`) once the lock is released."""
        spare = [] if self.spares is None else self.spares.drop(model_id)
        for client in spare:
            client.stopping()
        entry = self._loaded.pop(model_id, None)
        if entry is None:
            return spare
        entry.client.stopping()
        self._set_status(entry.record, state="stopped", pid=None)
        if self.metrics is not None:
            self.metrics.model_unloaded(model_id)
        return [entry.client, *spare]

    def reap(self, now: float | None = None) -> list[str]:
        """Unload models idle for longer than ``keep_alive``; the ids unloaded."""
        now = time.monotonic() if now is None else now
        gone: list[str] = []
        stopped: list[EngineClient] = []
        with self._cond:
            busy = set(self._busy.values())
            for model_id, entry in list(self._loaded.items()):
                if model_id in busy or now - entry.last_used < self.keep_alive:
                    continue
                stopped += self._unload(model_id)
                gone.append(model_id)
        _stop(stopped)
        for model_id in gone:
            log.info("unloaded %s after its keep-alive", model_id)
        return sorted(gone)

    def evict(self, record: ModelRecord) -> None:
        """Unload a model whose engine is idle (deleted, or found corrupt)."""
        with self._cond:
            stopped = [] if record.id in self._busy.values() else self._unload(record.id)
        _stop(stopped)
        self._vocabularies.drop(record.digest)

    def context_length(self, record: ModelRecord) -> int | None:
        """One sequence's context ``record`` runs at here: its engine's when loaded, else
        what an engine loaded with this service's settings would have (read off the
        file's header, once a digest); ``None`` when that cannot be known (no such
        engine here, an unreadable file)."""
        with self._cond:
            entry = self._loaded.get(record.id)
        if entry is not None and entry.client.n_ctx > 0:
            return entry.client.n_ctx
        known = self._contexts.get(record.digest)
        if known is not None:
            return known
        engine = self.engines.get(record.engine)
        if engine is None:
            return None
        try:
            path = model_path(self.blobs_dir, record)
            known = engine.context_length(path, self.n_ctx, self._options(record))
        except Exception as exc:
            log.info("no context length for %s: %s", record.id, exc)
            return None
        self._contexts[record.digest] = known
        return known

    # -- prompt length before queueing ---------------------------------------------------
    def _options(self, record: ModelRecord) -> LoadOptions:
        """How ``record``'s engine loads: the API side's tokenizer sizes the context with
        the same options, so both agree on it before the engine has started. A remote
        model's engine keeps the API's priority: it only relays, and its upstream may
        share this machine's cores."""
        nice = self.load.nice if record.remote is None else 0
        return replace(self.load, digest=record.digest, remote=record.remote, nice=nice)

    def constrains(self, record: ModelRecord) -> bool:
        """Whether ``record``'s engine holds output to a grammar (tools, JSON schemas): a
        remote model's when its upstream was found to run llguidance grammars."""
        engine = self.engines.get(record.engine)
        if engine is None:
            return True  # no such engine here: the task says so when it runs
        return engine.constrains or remote_constrains(record.remote)

    def holds_json(self, record: ModelRecord) -> bool:
        """Whether ``record``'s engine, though it cannot hold output to every grammar,
        holds it to a JSON Schema (a remote model on an upstream that runs GBNF)."""
        return holds_json(record.remote)

    def _locked_tokenizer(self, record: ModelRecord, engine: Engine) -> Tokenizer:
        """The model's shared tokenizer (one thread at a time); ``model_load_failed``
        when its vocabulary cannot be read (then neither can the model)."""
        try:
            return self._vocabularies.shared(self._tokenizer(record, engine))
        except Exception as exc:
            log.warning("reading the vocabulary of %s failed: %s", record.id, exc)
            raise EngineError("model_load_failed", f"Loading {record.id!r} failed.") from exc

    def _tokenizer(self, record: ModelRecord, engine: Engine) -> Tokenizer:
        """The model's vocabulary-only tokenizer (loads no weights), made once."""

        def make() -> Tokenizer:
            path = model_path(self.blobs_dir, record)
            return engine.tokenizer(path, self.n_ctx, self._options(record))

        return self._vocabularies.get(record, make)

    def prompt_size(
        self,
        record: ModelRecord,
        messages: list[dict[str, str]],
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[int, int] | None:
        """``(prompt tokens, context size)`` with the model's own tokenizer, or ``None``
        when that cannot be known now (the blob is damaged, the engine cannot read it):
        the task then reports the problem when it runs."""
        engine = self.engines.get(record.engine)
        if engine is None:
            return None
        try:
            self.check(record)
            tokenizer = self._vocabularies.shared(self._tokenizer(record, engine))
            prompt = tokenizer.prompt_tokens(messages, tools)
            return len(prompt), tokenizer.n_ctx
        except Exception as exc:
            log.info("no prompt size for %s before queueing: %s", record.id, exc)
            return None

    # -- embeddings --------------------------------------------------------------------
    def tokenizer(self, record: ModelRecord) -> Tokenizer:
        """The model's vocabulary-only tokenizer, shared (one thread at a time): what an
        embedding request is tokenized and checked with before any work. Raises
        :class:`EngineError` (``model_corrupt``, ``model_load_failed``)."""
        engine = self.engines.get(record.engine)
        if engine is None:
            raise EngineError("model_load_failed", f"No engine {record.engine!r} here.")
        self.check(record)
        return self._locked_tokenizer(record, engine)

    def embedding_engine(self, record: ModelRecord) -> tuple[EngineClient, int]:
        """The model's engine, started if need be (blocks meanwhile), and the slot that
        marks it in use until :meth:`release`: ask it for embeddings in between."""
        slot = next(self._embed_slots)
        return self.get(record, slot), slot

    def embeds_cancelled(self) -> dict[str, int]:
        """Each loaded model's embedding requests its engine dropped on a cancel."""
        with self._cond:
            return {m: entry.client.embeds_cancelled for m, entry in self._loaded.items()}

    def embed(self, record: ModelRecord, inputs: list[list[int]]) -> npt.NDArray[np.float32]:
        """The embeddings of ``inputs`` (token lists), blocking (see
        :meth:`embedding_engine`)."""
        client, slot = self.embedding_engine(record)
        try:
            return client.embed(inputs)
        finally:
            self.release(slot)

    def close(self) -> None:
        """Stop every engine (the service is shutting down); a later :meth:`get`
        starts one again."""
        stopped: list[EngineClient] = []
        with self._cond:
            self._closed = True
            for model_id in list(self._loaded):
                stopped += self._unload(model_id)
            for client in [] if self.spares is None else self.spares.close():
                client.stopping()
                stopped.append(client)
        _stop(stopped)
        self.ahead.close()
        self._vocabularies.close()


def _stop(clients: list[EngineClient]) -> None:
    for client in clients:
        client.close()
