"""The model host: blob checks before a load, keep-alive, the loaded-models limit, and
the supervision of engines (restarted after a crash, a crash loop bounded); engines run
on threads here, with a fake model behind the real loop and protocol."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmsp.engines.base import EngineCrashed, EngineError, LoadOptions, Piece, Sampling
from lmsp.engines.batch import Logits, Request
from lmsp.engines.client import EngineClient
from lmsp.engines.core import Seq
from lmsp.engines.host import ModelHost
from lmsp.engines.worker import die
from lmsp.store.blobs import store_blob
from lmsp.store.models import ModelRecord


class FakeBackend:
    """A model in its engine (on a thread here): one piece per sequence."""

    n_ctx = 64
    max_step_tokens = 64

    def __init__(self, name: str, sequences: int) -> None:
        self.name = name
        self.sequences = sequences
        self.closed = False

    def memory_bytes(self) -> int:
        return 0

    def open(self, seq: Seq) -> None:
        seq.slot = 0

    def decode(self, step: list[Request]) -> None:
        for r in step:
            r.result = np.zeros(1, np.float32)

    def evaluated(self, seq: Seq) -> None:
        return None

    def sent(self, seqs: list[Seq]) -> None:
        return None

    def pick(self, seq: Seq, logits: Logits) -> Piece | None:
        if b"crash" in bytes(seq.prompt):
            die()
        return Piece(1, "x") if seq.produced == 0 else None

    def release(self, seq: Seq, intact: bool) -> None:
        return None

    def figures(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.closed = True


class FakeTokenizer:
    n_ctx = 64
    n_embd = 8
    n_vocab = 256

    def text_tokens(self, text: str) -> list[int]:
        return list(text.encode())

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return [ord(c) for m in messages for c in m["content"]]

    def close(self) -> None:
        return None


class FakeEngine:
    name = "fake"

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.options: list[LoadOptions | None] = []
        self.backends: list[FakeBackend] = []

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> FakeBackend:
        if path.read_bytes().startswith(b"broken"):
            raise RuntimeError("cannot parse")
        self.loads.append(path.read_bytes().decode())
        self.options.append(options)
        backend = FakeBackend(path.read_bytes().decode(), (options or LoadOptions()).sequences)
        self.backends.append(backend)
        return backend

    def tokenizer(
        self, path: Path, n_ctx: int, options: LoadOptions | None = None
    ) -> FakeTokenizer:
        return FakeTokenizer()


def text(client: EngineClient, prompt: str) -> str:
    return "".join(p.text for p in client.generate(list(prompt.encode()), [], Sampling()))


def record(blobs: Path, name: str, content: bytes | None = None) -> ModelRecord:
    digest, size = store_blob(blobs, content if content is not None else name.encode())
    return ModelRecord(name, "fake", "fake", digest, size, "lmsp", 0, {})


@pytest.fixture
def blobs(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


def host(blobs: Path, engine: FakeEngine, **kw: Any) -> ModelHost:
    return ModelHost(blobs, {"fake": engine}, 64, in_thread={"fake"}, **kw)  # type: ignore[dict-item]


def wait(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_load_keep_and_reuse(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine)
    a = record(blobs, "a")
    assert not h.is_loaded("a")
    model = h.get(a, 0)
    h.release(0)
    assert h.get(a, 0) is model and engine.loads == ["a"]
    assert h.is_loaded("a") and h.loaded_ids() == {"a"}
    assert text(model, "hi") == "x" and model.prompt_tokens([{"content": "hi"}]) == [104, 105]
    h.close()


def test_every_slot_shares_one_context_of_a_model(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine, load=LoadOptions(sequences=4))
    a = record(blobs, "a")
    first, second = h.get(a, 0), h.get(a, 1)  # two tasks at once
    assert first is second and engine.loads == ["a"] and first.sequences == 4
    options = engine.options[0]
    assert options is not None and options.sequences == 4 and options.digest == a.digest
    h.release(0)
    assert h.reap(now=1e12) == []  # slot 1 still generates with it
    h.release(1)
    assert h.reap(now=1e12) == ["a"] and engine.backends[0].closed and not first.alive


def test_keep_alive_unloads_idle_models_only(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine, keep_alive=10, max_loaded=2)
    a, b = record(blobs, "a"), record(blobs, "b")
    h.get(a, 0)
    h.release(0)
    h.get(b, 1)  # another slot, still busy
    assert h.reap() == []  # within keep-alive
    far = 1e12
    assert h.reap(now=far) == ["a"]  # b is in use by slot 1: kept
    assert engine.backends[0].closed and not h.is_loaded("a") and h.is_loaded("b")
    h.release(1)
    assert h.reap(now=far) == ["b"]
    assert engine.backends[1].closed
    assert {e["model"]: e["state"] for e in h.engine_status()} == {"a": "stopped", "b": "stopped"}


def test_another_model_takes_the_memory_of_the_least_recently_used(blobs: Path) -> None:
    h = host(blobs, FakeEngine(), max_loaded=2)
    a, b, c = record(blobs, "a"), record(blobs, "b"), record(blobs, "c")
    for rec in (a, b):
        h.get(rec, 0)
        h.release(0)
    h.get(a, 0)  # a is now the most recently used
    h.release(0)
    h.get(c, 0)
    h.release(0)
    assert h.loaded_ids() == {"a", "c"}
    h.close()


def test_a_busy_model_is_unloaded_only_once_released(blobs: Path) -> None:
    h = host(blobs, FakeEngine(), max_loaded=1)
    a, b = record(blobs, "a"), record(blobs, "b")
    h.get(a, 0)
    got = threading.Event()

    def other_slot() -> None:
        h.get(b, 1)
        got.set()

    thread = threading.Thread(target=other_slot)
    thread.start()
    assert not got.wait(0.3)  # b waits while a generates
    assert h.loaded_ids() == {"a"}
    h.release(0)
    thread.join(10)
    assert got.is_set() and h.loaded_ids() == {"b"}
    h.close()


def test_size_is_checked_before_every_load(blobs: Path) -> None:
    h = host(blobs, FakeEngine())
    a = record(blobs, "a")
    h.get(a, 0)
    h.release(0)
    with pytest.raises(EngineError) as err:
        h.get(replace(a, size_bytes=a.size_bytes + 1), 0)
    assert err.value.code == "model_corrupt"
    h.close()


def test_the_digest_is_checked_on_first_use(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine)
    a = record(blobs, "a")
    forged = replace(a, digest="sha256:" + "0" * 64)
    (blobs / f"sha256-{'0' * 64}").write_bytes(b"a")  # the right size, the wrong bytes
    with pytest.raises(EngineError) as err:
        h.get(forged, 0)
    assert err.value.code == "model_corrupt" and engine.loads == []


def test_a_corrupt_record_is_never_loaded(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine)
    a = replace(record(blobs, "a"), status="corrupt")
    with pytest.raises(EngineError) as err:
        h.get(a, 0)
    assert err.value.code == "model_corrupt" and engine.loads == []
    assert h.prompt_size(a, [{"role": "user", "content": "hi"}]) is None


def test_a_load_failure_is_model_load_failed(blobs: Path) -> None:
    h = host(blobs, FakeEngine())
    bad = record(blobs, "bad", b"broken file")
    with pytest.raises(EngineError) as err:
        h.get(bad, 0)
    assert err.value.code == "model_load_failed"


def test_prompt_size_uses_the_model_tokenizer(blobs: Path) -> None:
    h = host(blobs, FakeEngine())
    a = record(blobs, "a")
    assert h.prompt_size(a, [{"role": "user", "content": "hello"}]) == (5, 64)


def test_a_crashed_engine_is_restarted_and_its_streams_hear_of_it(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine, max_restarts=5)
    a = record(blobs, "a")
    first = h.get(a, 0)
    with pytest.raises(EngineCrashed) as crash:
        text(first, "crash")
    assert crash.value.code == "engine_crashed"
    h.release(0)
    wait(lambda: h.is_loaded("a") and h.engine_status()[0]["state"] == "ready")
    again = h.get(a, 0)  # started again by the host, not by this call
    assert again is not first and len(engine.loads) == 2 and text(again, "hi") == "x"
    (status,) = h.engine_status()
    assert (status["restarts"], status["crashes"]) == (1, 1) and "thread" in status["last_exit"]
    h.close()


def test_a_crash_loop_marks_the_model_failed_until_verified(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine, max_restarts=2, restart_window=600)
    a, b = record(blobs, "a"), record(blobs, "b")
    for crash in range(3):
        client = h.get(a, 0)
        with pytest.raises(EngineCrashed):
            text(client, "crash")
        h.release(0)
        if crash < 2:
            wait(lambda: h.is_loaded("a"))
    wait(lambda: h.engine_status()[0]["state"] == "failed")
    with pytest.raises(EngineError) as err:
        h.get(a, 0)
    assert err.value.code == "engine_crashed" and "crashed 3 times" in err.value.message
    assert not isinstance(err.value, EngineCrashed)  # no policy: the task fails
    (status,) = h.engine_status()
    assert (status["restarts"], status["crashes"], status["pid"]) == (2, 3, None)
    assert text(h.get(b, 1), "hi") == "x"  # another model goes on
    h.release(1)
    h.verified(a.digest, True)  # an intact blob: it may be started again
    assert text(h.get(a, 0), "hi") == "x"
    h.close()


def test_a_warm_load_checks_the_digest_while_the_engine_loads(blobs: Path) -> None:
    """After a restart the engine starts at once and the blob's digest is checked beside
    its load; a blob that fails the check is never served, and its engine is stopped."""
    engine = FakeEngine()
    h = host(blobs, engine, max_loaded=2)
    a = record(blobs, "a")
    forged = replace(a, id="forged", digest="sha256:" + "1" * 64)
    (blobs / f"sha256-{'1' * 64}").write_bytes(b"b")  # the right size, the wrong bytes
    thread = h.warm([forged, a])
    assert thread is not None
    thread.join(10)
    assert h.loaded_ids() == {"a"}  # the intact one is loaded, the forged one is not
    states = {s["model"]: s["state"] for s in h.engine_status()}
    assert states == {"a": "ready", "forged": "stopped"}  # launched at once, then stopped
    forged_engines = [b for b in engine.backends if b.name == "b"]
    wait(lambda: all(b.closed for b in forged_engines))  # if it got as far as loading
    with pytest.raises(EngineError) as err:
        h.get(forged, 0)
    assert err.value.code == "model_corrupt"
    assert text(h.get(a, 0), "hi") == "x"
    h.close()


class Reattaching:
    """A stand-in for :class:`lmsp.engines.reattach.Registry` that always finds an
    engine an earlier process left running (here: one started on the spot)."""

    def prepare(self, spec: Any) -> Any:
        return spec

    def reattach(self, spec: Any, make: Any) -> EngineClient:
        client: EngineClient = make(spec)
        client.launch()
        return client

    def record(self, client: EngineClient) -> None:
        return None


def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads the model host hashes a blob on, from now on."""
    import lmsp.engines.host as host_module

    seen: list[str] = []
    real = host_module.check_digest

    def recorded(blobs_dir: Path, rec: ModelRecord) -> str | None:
        seen.append(threading.current_thread().name)
        return real(blobs_dir, rec)

    monkeypatch.setattr(host_module, "check_digest", recorded)
    return seen


def test_a_reattached_engines_blob_is_hashed_by_the_warm_load_not_on_the_resume(
    blobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reattached engine's blob was checked by the process that loaded it; this one
    hashes it once (its first meeting of the digest) on the warm load's thread, beside
    the rest of the start, not when the resumed task first asks for the engine."""
    h = ModelHost(blobs, {"fake": FakeEngine()}, 64)  # type: ignore[dict-item]
    h.registry = Reattaching()  # type: ignore[assignment]  # (only a process's engine)
    a = record(blobs, "a")
    seen = hashes(monkeypatch)
    thread = h.warm([a])
    assert thread is not None
    thread.join(10)
    assert seen == ["lmsp-warm"]
    assert text(h.get(a, 0), "hi") == "x"
    assert seen == ["lmsp-warm"]  # the task's get found it checked
    h.close()


def test_a_blob_a_standby_hashed_is_not_hashed_again(
    blobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digests a standby hashed while it waited (``verified``) count as this
    process's own check: a load checks their size only; another blob is hashed."""
    a, b = record(blobs, "a"), record(blobs, "b")
    h = host(blobs, FakeEngine(), max_loaded=2, verified=frozenset({a.digest}))
    seen = hashes(monkeypatch)
    assert text(h.get(a, 0), "hi") == "x"
    assert seen == []
    assert text(h.get(b, 1), "hi") == "x"
    assert len(seen) == 1
    h.close()
