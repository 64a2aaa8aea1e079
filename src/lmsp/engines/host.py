"""Which engine runs a model record, whether its blob is intact, and which models are
loaded.

Before a blob is handed to an engine it is checked against its record: the size every
time, the full SHA-256 the first time this process uses it. Loaded models stay for
``keep_alive`` seconds after their last use and are unloaded sooner when another model
needs the memory: at most ``max_loaded`` distinct models are loaded at once. A loaded
model is one context whose ``sequences`` sequences the runner's slots step together.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsp.engines.base import Engine, EngineError, LoadedModel, LoadOptions, Tokenizer
from lmsp.metrics import Metrics
from lmsp.store.blobs import blob_path, check_digest, check_size
from lmsp.store.models import ModelRecord

__all__ = ["ModelHost", "blob_path"]

log = logging.getLogger(__name__)


@dataclass
class _Loaded:
    digest: str
    model: LoadedModel
    last_used: float = field(default_factory=time.monotonic)


class ModelHost:
    """Loads models on demand, verifies their blobs, and unloads idle ones."""

    def __init__(
        self,
        blobs_dir: Path,
        engines: dict[str, Engine],
        n_ctx: int,
        *,
        keep_alive: float = 300.0,
        max_loaded: int = 1,
        sequences: int = 1,
        prefix_files: Any = None,
    ) -> None:
        self.blobs_dir = blobs_dir
        self.engines = engines
        self.n_ctx = n_ctx
        self.keep_alive = keep_alive
        self.max_loaded = max(1, max_loaded)
        self.sequences = max(1, sequences)
        self.prefix_files = prefix_files  # a PrefixFiles: saved prompt prefixes
        self._loaded: dict[tuple[str, int], _Loaded] = {}  # (model id, 0): one context
        self._busy: dict[int, str] = {}  # slot → model id it is using
        self._cond = threading.Condition()
        self._verified: set[str] = set()  # digests fully hashed by this process
        self._verify_lock = threading.Lock()
        self._tokenizers: dict[str, Tokenizer] = {}
        self._tokenizer_lock = threading.Lock()
        self.metrics: Metrics | None = None  # the service's: loads and unloads

    # -- what is loaded ----------------------------------------------------------------
    def is_loaded(self, model_id: str) -> bool:
        return any(key[0] == model_id for key in list(self._loaded))

    def loaded_ids(self) -> set[str]:
        return {key[0] for key in list(self._loaded)}

    def loaded(self, now: float | None = None) -> list[dict[str, object]]:
        """Every loaded context: model, slot, digest, memory, whether a task uses it, and
        for an idle one the seconds until its keep-alive unloads it."""
        now = time.monotonic() if now is None else now
        with self._cond:
            entries = sorted(self._loaded.items())
            busy = set(self._busy.items())
        shown: list[dict[str, object]] = []
        for (model_id, slot), entry in entries:
            measure = getattr(entry.model, "memory_bytes", None)
            memory = measure() if callable(measure) else None
            if memory is None:
                path = blob_path(self.blobs_dir, entry.digest)
                memory = path.stat().st_size if path.exists() else 0
            in_use = model_id in {m for _, m in busy}
            left = None if in_use else max(0.0, self.keep_alive - (now - entry.last_used))
            shown.append(
                {
                    "model": model_id,
                    "slot": slot,
                    "digest": entry.digest,
                    "memory_bytes": int(memory),
                    "busy": in_use,
                    "unloads_in": None if left is None else round(left, 1),
                }
            )
        return shown

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
        """Record the outcome of a full check done elsewhere (``lmsp models verify``)."""
        with self._verify_lock:
            if ok:
                self._verified.add(digest)
            else:
                self._verified.discard(digest)

    # -- loading -----------------------------------------------------------------------
    def get(self, record: ModelRecord, slot: int = 0) -> LoadedModel:
        """The model, loaded once for every runner slot, marked in use by ``slot`` until
        :meth:`release`. Raises ``EngineError`` (``model_corrupt``, ``model_load_failed``)."""
        engine = self.engines.get(record.engine)
        if engine is None:
            raise EngineError("model_load_failed", f"No engine {record.engine!r} here.")
        self.check(record)
        key = (record.id, 0)
        with self._cond:
            cached = self._loaded.get(key)
            if cached is not None and cached.digest != record.digest:
                while any(m == record.id for m in self._busy.values()):
                    self._cond.wait(1.0)  # the id now names another blob: unload when idle
                self._unload(key)
                cached = None
            if cached is None:
                self._make_room(record.id, slot)
                path = blob_path(self.blobs_dir, record.digest)
                options = LoadOptions(self.sequences, record.digest, self.prefix_files)
                try:
                    model = engine.load(path, self.n_ctx, options)
                except EngineError:
                    raise
                except Exception as exc:  # its words (paths …) go to the log only
                    log.warning("loading %s failed: %s", record.id, exc)
                    failed = f"Loading {record.id!r} failed."
                    raise EngineError("model_load_failed", failed) from exc
                cached = _Loaded(record.digest, model)
                self._loaded[key] = cached
                log.info("loaded %s (%d sequences)", record.id, self.sequences)
                if self.metrics is not None:
                    self.metrics.model_loaded(record.id)
            self._busy[slot] = record.id
            cached.last_used = time.monotonic()
            return cached.model

    def release(self, slot: int) -> None:
        """The slot's task is over: its model starts its keep-alive."""
        with self._cond:
            model_id = self._busy.pop(slot, None)
            entry = self._loaded.get((model_id, 0)) if model_id is not None else None
            if entry is not None:
                entry.last_used = time.monotonic()
            self._cond.notify_all()

    def _make_room(self, model_id: str, slot: int) -> None:
        """Unload least recently used idle models until ``model_id`` fits; wait for a
        busy one to finish when no idle one is left (called with the lock held)."""
        while True:
            others = self.loaded_ids() - {model_id}
            if len(others) < self.max_loaded:
                return
            busy = set(self._busy.values())
            idle = [m for m in others if m not in busy]
            if idle:
                victim = min(idle, key=self._last_used)
                for key in [k for k in self._loaded if k[0] == victim]:
                    self._unload(key)
                log.info("unloaded %s to make room for %s", victim, model_id)
                continue
            self._cond.wait(1.0)

    def _last_used(self, model_id: str) -> float:
        return max(e.last_used for k, e in self._loaded.items() if k[0] == model_id)

    def _unload(self, key: tuple[str, int]) -> None:
        entry = self._loaded.pop(key, None)
        if entry is not None:
            entry.model.close()
            if self.metrics is not None:
                self.metrics.model_unloaded(key[0])

    def reap(self, now: float | None = None) -> list[str]:
        """Unload models idle for longer than ``keep_alive``; the ids unloaded."""
        now = time.monotonic() if now is None else now
        gone: list[str] = []
        with self._cond:
            busy = set(self._busy.values())
            for key, entry in list(self._loaded.items()):
                if key[0] in busy or now - entry.last_used < self.keep_alive:
                    continue
                self._unload(key)
                gone.append(key[0])
        for model_id in sorted(set(gone)):
            log.info("unloaded %s after its keep-alive", model_id)
        return sorted(set(gone))

    def evict(self, record: ModelRecord) -> None:
        """Unload every idle context of a model (deleted, or found corrupt)."""
        with self._cond:
            busy = set(self._busy.values())
            for key in [k for k in self._loaded if k[0] == record.id]:
                if key[0] not in busy:
                    self._unload(key)
        with self._tokenizer_lock:
            tokenizer = self._tokenizers.pop(record.digest, None)
            if tokenizer is not None:
                tokenizer.close()

    # -- prompt length before queueing ---------------------------------------------------
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
            with self._tokenizer_lock:
                tokenizer = self._tokenizers.get(record.digest)
                if tokenizer is None:
                    path = blob_path(self.blobs_dir, record.digest)
                    tokenizer = engine.tokenizer(path, self.n_ctx)
                    self._tokenizers[record.digest] = tokenizer
                prompt = (
                    tokenizer.prompt_tokens(messages, tools)
                    if tools
                    else tokenizer.prompt_tokens(messages)
                )
                return len(prompt), tokenizer.n_ctx
        except Exception as exc:
            log.info("no prompt size for %s before queueing: %s", record.id, exc)
            return None

    def close(self) -> None:
        with self._cond:
            for key in list(self._loaded):
                self._unload(key)
        with self._tokenizer_lock:
            for tokenizer in self._tokenizers.values():
                tokenizer.close()
            self._tokenizers.clear()
