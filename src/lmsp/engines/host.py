"""Which engine runs a model record, where its blob is, and which models are loaded."""

from __future__ import annotations

import threading
from pathlib import Path

from lmsp.engines.base import Engine, EngineError, LoadedModel
from lmsp.store.models import ModelRecord


def blob_path(blobs_dir: Path, digest: str) -> Path:
    algo, hexdigest = digest.split(":", 1)
    return blobs_dir / f"{algo}-{hexdigest}"


class ModelHost:
    """Loads models on demand and keeps them; one load at a time per model."""

    def __init__(self, blobs_dir: Path, engines: dict[str, Engine], n_ctx: int) -> None:
        self.blobs_dir = blobs_dir
        self.engines = engines
        self.n_ctx = n_ctx
        self._loaded: dict[tuple[str, int], tuple[str, LoadedModel]] = {}
        self._lock = threading.Lock()

    def is_loaded(self, model_id: str) -> bool:
        return any(key[0] == model_id for key in self._loaded)

    def get(self, record: ModelRecord, slot: int = 0) -> LoadedModel:
        """The model loaded for one runner slot (a context serves one task at a time)."""
        with self._lock:
            cached = self._loaded.get((record.id, slot))
            if cached is not None and cached[0] == record.digest:
                return cached[1]
            engine = self.engines.get(record.engine)
            if engine is None:
                raise EngineError("model_load_failed", f"No engine {record.engine!r} here.")
            path = blob_path(self.blobs_dir, record.digest)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise EngineError(
                    "model_corrupt", f"The blob of {record.id!r} is missing."
                ) from None
            if size != record.size_bytes:
                raise EngineError(
                    "model_corrupt",
                    f"The blob of {record.id!r} has {size} bytes, {record.size_bytes} expected.",
                )
            try:
                loaded = engine.load(path, self.n_ctx)
            except EngineError:
                raise
            except Exception as exc:
                raise EngineError(
                    "model_load_failed", f"Loading {record.id!r} failed: {exc}"
                ) from exc
            self._loaded[(record.id, slot)] = (record.digest, loaded)
            return loaded

    def close(self) -> None:
        with self._lock:
            for _, model in self._loaded.values():
                model.close()
            self._loaded.clear()
