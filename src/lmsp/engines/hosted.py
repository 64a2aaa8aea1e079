"""What the model host (:mod:`lmsp.engines.host`) keeps of each model: its loaded engine
process, its engine's status as ``lmsp ps``, ``/healthz`` and ``/metrics`` show it, and
the vocabulary-only tokenizers the API process shares under a lock, with the prompts
each rendered last."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from lmsp.engines.base import Tokenizer
from lmsp.engines.client import EngineClient
from lmsp.store.blobs import blob_path
from lmsp.store.models import ModelRecord


@dataclass
class Loaded:
    record: ModelRecord
    client: EngineClient
    last_used: float = field(default_factory=time.monotonic)

    def shown(
        self, blobs_dir: Path, status: dict[str, Any], in_use: bool, left: float
    ) -> dict[str, object]:
        """As ``lmsp ps`` shows it: ``left``, the seconds its keep-alive has left, only
        when no task uses it."""
        memory = self.client.memory
        if not memory:
            path = blob_path(blobs_dir, self.record.digest)
            memory = path.stat().st_size if path.exists() else 0
        return {
            "model": self.record.id,
            "digest": self.record.digest,
            "pid": self.client.pid,
            "restarts": status.get("restarts", 0),
            "memory_bytes": int(memory),
            "busy": in_use,
            "unloads_in": None if in_use else round(max(0.0, left), 1),
        }


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

    def crashed(self, message: str, restart: bool, window: float, most: int) -> bool:
        """Count a crash; whether the engine may start again: not after more than
        ``most`` crashes within ``window`` seconds (its model is then failed)."""
        now = time.monotonic()
        self.crashes += 1
        self.last_exit = message
        self.pid = None
        self.crash_times.append(now)
        while self.crash_times and self.crash_times[0] < now - window:
            self.crash_times.popleft()
        if len(self.crash_times) <= most:
            self.state = "restarting" if restart else "stopped"
            return True
        self.state = "failed"
        self.error = (
            f"The engine of {self.model!r} crashed {len(self.crash_times)} times within"
            f" {window:.0f} s and is not started again; the last time: {message} Check the"
            " model file (`lmsp models verify`) or restart the service."
        )
        return False

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


class Prompts:
    """The prompts one tokenizer rendered last, by their messages and tools: a create
    measures its prompt (the length check) and its worker renders the same prompt a
    moment later, in the same process; the second is a look-up. Used under the
    tokenizer's lock."""

    #: how many prompts are kept, and the longest messages (as JSON) kept at all
    SIZE = 64
    LARGEST = 64 * 1024

    def __init__(self) -> None:
        self._kept: OrderedDict[bytes, list[int]] = OrderedDict()

    @staticmethod
    def key(messages: list[dict[str, str]], tools: list[dict[str, Any]] | None) -> bytes | None:
        try:
            key = _KEY.encode((messages, tools or None))
        except (TypeError, msgspec.EncodeError):
            return None
        return key if len(key) <= Prompts.LARGEST else None

    def get(self, key: bytes | None) -> list[int] | None:
        if key is None:
            return None
        tokens = self._kept.get(key)
        if tokens is None:
            return None
        self._kept.move_to_end(key)
        return list(tokens)

    def keep(self, key: bytes | None, tokens: list[int]) -> None:
        if key is None:
            return
        self._kept[key] = list(tokens)
        while len(self._kept) > self.SIZE:
            self._kept.popitem(last=False)


_KEY = msgspec.json.Encoder()


class LockedTokenizer:
    """A shared vocabulary-only tokenizer, used by one thread at a time, with the
    prompts it rendered last (:class:`Prompts`)."""

    def __init__(self, tokenizer: Tokenizer, lock: threading.Lock, prompts: Prompts) -> None:
        self.tokenizer = tokenizer
        self.n_ctx = tokenizer.n_ctx
        self.n_embd = tokenizer.n_embd
        self.n_vocab = tokenizer.n_vocab
        self._lock = lock
        self._prompts = prompts

    def text_tokens(self, text: str) -> list[int]:
        with self._lock:
            return self.tokenizer.text_tokens(text)

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        key = Prompts.key(messages, tools)
        with self._lock:
            tokens = self._prompts.get(key)
            if tokens is None:
                if tools:
                    tokens = self.tokenizer.prompt_tokens(messages, tools)
                else:
                    tokens = self.tokenizer.prompt_tokens(messages)
                self._prompts.keep(key, tokens)
            return tokens

    def close(self) -> None:
        return None


class Vocabularies:
    """Each model blob's vocabulary-only tokenizer in the API process, made once and
    shared under one lock (:class:`LockedTokenizer`); a standby's, made while it waited,
    are taken over as they are first asked for."""

    def __init__(self, preloaded: dict[str, Tokenizer] | None = None) -> None:
        self.lock = threading.Lock()
        self._made: dict[str, Tokenizer] = {}  # digest → its tokenizer
        # local GGUF models' tokenizers made before the host (a standby's), by digest
        self._preloaded = dict(preloaded or {})
        # each shared tokenizer's last prompts, by its id (the tokenizer kept beside)
        self._prompts: dict[int, tuple[Tokenizer, Prompts]] = {}

    def get(self, record: ModelRecord, make: Callable[[], Tokenizer]) -> Tokenizer:
        """``record``'s tokenizer: the one made already, a preloaded one (a local GGUF
        model's), or ``make()``."""
        with self.lock:
            tokenizer = self._made.get(record.digest)
            if tokenizer is None and record.engine == "llama_cpp" and record.remote is None:
                tokenizer = self._preloaded.pop(record.digest, None)
            if tokenizer is None:
                tokenizer = make()
            self._made[record.digest] = tokenizer
            return tokenizer

    def shared(self, tokenizer: Tokenizer) -> LockedTokenizer:
        with self.lock:  # the tokenizer kept with its prompts: its id is not reused
            _, prompts = self._prompts.setdefault(id(tokenizer), (tokenizer, Prompts()))
        return LockedTokenizer(tokenizer, self.lock, prompts)

    def drop(self, digest: str) -> None:
        """Close the tokenizer of ``digest`` (its model evicted)."""
        with self.lock:
            tokenizer = self._made.pop(digest, None)
            if tokenizer is not None:
                self._prompts.pop(id(tokenizer), None)
                tokenizer.close()

    def close(self) -> None:
        with self.lock:
            for tokenizer in [*self._made.values(), *self._preloaded.values()]:
                tokenizer.close()
            self._made.clear()
            self._preloaded.clear()
            self._prompts.clear()
