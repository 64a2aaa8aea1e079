"""What the model host (:mod:`lmsp.engines.host`) keeps of each model: its loaded engine
process, its engine's status as ``lmsp ps``, ``/healthz`` and ``/metrics`` show it, and
the vocabulary-only tokenizer the API process shares under a lock."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lmsp.engines.base import Tokenizer
from lmsp.engines.client import EngineClient
from lmsp.store.models import ModelRecord


@dataclass
class Loaded:
    record: ModelRecord
    client: EngineClient
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class EngineStatus:
    """One model's engine as ``lmsp ps``, ``/healthz`` and ``/metrics`` show it."""

    model: str
    digest: str
    state: str = "starting"  # starting, ready, restarting, failed, stopped
    pid: int | None = None
    restarts: int = 0  # started again after a crash, since the service started
    crashes: int = 0
    last_exit: str | None = None  # how its last process ended unasked
    error: str | None = None  # why it is failed
    crash_times: deque[float] = field(default_factory=deque)

    def shown(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "crashes": self.crashes,
            "last_exit": self.last_exit,
            "error": self.error,
        }


class LockedTokenizer:
    """A shared vocabulary-only tokenizer, used by one thread at a time."""

    def __init__(self, tokenizer: Tokenizer, lock: threading.Lock) -> None:
        self.tokenizer = tokenizer
        self.n_ctx = tokenizer.n_ctx
        self.n_embd = tokenizer.n_embd
        self.n_vocab = tokenizer.n_vocab
        self._lock = lock

    def text_tokens(self, text: str) -> list[int]:
        with self._lock:
            return self.tokenizer.text_tokens(text)

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        with self._lock:
            if tools:
                return self.tokenizer.prompt_tokens(messages, tools)
            return self.tokenizer.prompt_tokens(messages)

    def close(self) -> None:
        return None
