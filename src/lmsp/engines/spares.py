"""Spare engines: one more engine process per loaded model, its model loaded and its KV
cache allocated, held back to take over at once when the serving one crashes
(``LMSP_SPARE_ENGINE``).

A crash of an engine otherwise costs a new process its start — the interpreter, its
imports, the model, the KV cells cleared — before the interrupted tasks resume. With a
spare, :class:`~lmsp.engines.host.ModelHost` takes it in place of a launch (its blob was
checked when it was made) and a new spare is made in the background. A spare starts a
while after its engine is ready (:data:`SPARE_AFTER`), so that its start does not take the
cores the model's first work, or the interrupted tasks' resumes, need. A spare runs
nothing: it costs the memory of its KV cache (the model's weights are mapped, shared
with the serving engine). One that dies idle is dropped; one whose model was unloaded,
changed or deleted is stopped with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from lmsp.engines.client import EngineClient
from lmsp.store.models import ModelRecord

log = logging.getLogger(__name__)

#: seconds after an engine is ready (a first one, or a spare that took over) before the
#: next spare is started
SPARE_AFTER = 10.0


class Spares:
    """The spare engine of each model (at most one), made in the background."""

    def __init__(self) -> None:
        self._ready: dict[str, tuple[str, EngineClient]] = {}  # model id → (digest, spare)
        self._making: set[str] = set()
        self._epoch: dict[str, int] = {}  # bumped by drop: a spare made meanwhile is stopped
        self._lock = threading.Lock()
        self._closed = False

    def take(self, record: ModelRecord) -> EngineClient | None:
        """The spare of ``record`` (its blob, alive), now no longer a spare; else ``None``."""
        with self._lock:
            found = self._ready.pop(record.id, None)
        if found is None:
            return None
        digest, client = found
        if digest == record.digest and client.alive:
            return client
        _stop([client])
        return None

    def make(
        self, record: ModelRecord, build: Callable[[], EngineClient], after: float = 0.0
    ) -> None:
        """Make ``record``'s spare in the background, ``after`` seconds, unless it has one
        or one is being made; ``build`` launches an engine and waits until it is ready."""
        with self._lock:
            if self._closed or record.id in self._ready or record.id in self._making:
                return
            self._making.add(record.id)
            epoch = self._epoch.get(record.id, 0)

        def run() -> None:
            client = None
            try:
                time.sleep(after)
                client = build()
            except Exception as exc:  # no spare; the serving engine goes on
                log.warning("no spare engine for %s: %s", record.id, exc)
            with self._lock:
                self._making.discard(record.id)
                current = self._epoch.get(record.id, 0) == epoch
                keep = client is not None and current and not self._closed
                if keep and client is not None:
                    self._ready[record.id] = (record.digest, client)
            if client is not None and not keep:
                _stop([client])
            elif client is not None:
                log.info(
                    "a spare engine for %s is ready (pid %s)",
                    record.id,
                    client.pid,
                    extra={"event": "engine.spare", "model": record.id},
                )

        threading.Thread(target=run, name="lmsp-spare", daemon=True).start()

    def drop(self, model_id: str) -> list[EngineClient]:
        """Forget ``model_id``'s spare; the caller stops it (:func:`stop`)."""
        with self._lock:
            self._epoch[model_id] = self._epoch.get(model_id, 0) + 1
            found = self._ready.pop(model_id, None)
        return [] if found is None else [found[1]]

    def close(self) -> list[EngineClient]:
        """Forget every spare, and make none again; the caller stops them."""
        with self._lock:
            self._closed = True
            found, self._ready = self._ready, {}
        return [client for _, client in found.values()]


def _stop(clients: list[EngineClient]) -> None:
    for client in clients:
        client.stopping()
        client.close()
