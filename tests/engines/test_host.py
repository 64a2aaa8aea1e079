"""The model host: blob checks before a load, keep-alive, and the loaded-models limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from lmsp.engines.base import EngineError, LoadOptions, Piece, Sampling
from lmsp.engines.host import ModelHost
from lmsp.store.blobs import store_blob
from lmsp.store.models import ModelRecord


class FakeModel:
    n_ctx = 64

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        return [ord(c) for m in messages for c in m["content"]]

    def generate(self, prompt: list[int], resume: list[int], sampling: Sampling) -> Iterator[Piece]:
        yield Piece(1, "x")

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    name = "fake"

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.options: list[LoadOptions | None] = []

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> FakeModel:
        if path.read_bytes().startswith(b"broken"):
            raise RuntimeError("cannot parse")
        self.loads.append(path.read_bytes().decode())
        self.options.append(options)
        return FakeModel(path.read_bytes().decode())

    def tokenizer(self, path: Path, n_ctx: int) -> FakeModel:
        return FakeModel("tokenizer")


def record(blobs: Path, name: str, content: bytes | None = None) -> ModelRecord:
    digest, size = store_blob(blobs, content if content is not None else name.encode())
    return ModelRecord(name, "fake", "fake", digest, size, "lmsp", 0, {})


@pytest.fixture
def blobs(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


def host(blobs: Path, engine: FakeEngine, **kw: float) -> ModelHost:
    return ModelHost(blobs, {"fake": engine}, 64, **kw)  # type: ignore[dict-item]


def test_load_keep_and_reuse(blobs: Path) -> None:
    engine = FakeEngine()
    h = host(blobs, engine)
    a = record(blobs, "a")
    assert not h.is_loaded("a")
    model = h.get(a, 0)
    h.release(0)
    assert h.get(a, 0) is model and engine.loads == ["a"]
    assert h.is_loaded("a") and h.loaded_ids() == {"a"}


def test_every_slot_shares_one_context_of_a_model(blobs: Path) -> None:
    engine = FakeEngine()
    h = ModelHost(blobs, {"fake": engine}, 64, sequences=4)  # type: ignore[dict-item]
    a = record(blobs, "a")
    first, second = h.get(a, 0), h.get(a, 1)  # two tasks at once
    assert first is second and engine.loads == ["a"]
    options = engine.options[0]
    assert options is not None and options.sequences == 4 and options.digest == a.digest
    h.release(0)
    assert h.reap(now=1e12) == []  # slot 1 still generates with it
    h.release(1)
    assert h.reap(now=1e12) == ["a"] and first.closed


def test_keep_alive_unloads_idle_models_only(blobs: Path) -> None:
    h = host(blobs, FakeEngine(), keep_alive=10, max_loaded=2)
    a, b = record(blobs, "a"), record(blobs, "b")
    model_a = h.get(a, 0)
    h.release(0)
    h2 = h.get(b, 1)  # another slot, still busy
    assert h.reap() == []  # within keep-alive
    far = 1e12
    assert h.reap(now=far) == ["a"]  # b is in use by slot 1: kept
    assert model_a.closed and not h.is_loaded("a") and h.is_loaded("b")
    h.release(1)
    assert h.reap(now=far) == ["b"]
    assert isinstance(h2, FakeModel) and h2.closed


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


def test_size_is_checked_before_every_load(blobs: Path) -> None:
    h = host(blobs, FakeEngine())
    a = record(blobs, "a")
    h.get(a, 0)
    h.release(0)
    with pytest.raises(EngineError) as err:
        h.get(replace(a, size_bytes=a.size_bytes + 1), 0)
    assert err.value.code == "model_corrupt"


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
