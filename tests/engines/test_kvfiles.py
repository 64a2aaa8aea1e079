"""The durable prefix cache on real files: it serves exactly the longest saved prefix of
the right model, detects and deletes any file that is not what was saved, and keeps to its
age and size bounds."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmsp import config
from lmsp.engines.kvfiles import (
    MAGIC,
    SUFFIX,
    TEMP_PREFIX,
    PrefixFiles,
    dir_name,
    prefix_key,
)

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
GIB = 1 << 30


def cache(tmp_path: Path, max_bytes: int = GIB, ttl: float = 7 * 86400) -> PrefixFiles:
    return PrefixFiles(tmp_path / "kv", max_bytes=max_bytes, ttl=ttl)


def state(n: int) -> bytes:
    """A payload that names its prefix length, as a KV state would."""
    return f"kv-state-of-{n}-tokens:".encode() + bytes(range(256)) * 4


def entry(kv: PrefixFiles, tokens: list[int], digest: str = DIGEST) -> Path:
    return kv.root / dir_name(digest) / f"{prefix_key(tokens)}{SUFFIX}"


PROMPT = list(range(1000, 1100))


def test_round_trip(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:40], state(40))
    path = entry(kv, PROMPT[:40])
    assert path.is_file()
    assert path.read_bytes().startswith(MAGIC)
    assert path.stat().st_mode & 0o777 == 0o600
    assert kv.best(DIGEST, PROMPT[:40]) == (40, state(40))
    assert kv.best(DIGEST, PROMPT) == (40, state(40))
    # a new instance (a restart) finds it from the files alone
    assert cache(tmp_path).best(DIGEST, PROMPT) == (40, state(40))
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_the_longest_saved_prefix_is_chosen(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    for n in (10, 30, 60, 90):
        kv.save(DIGEST, PROMPT[:n], state(n))
    assert kv.best(DIGEST, PROMPT) == (90, state(90))
    assert kv.best(DIGEST, PROMPT[:89]) == (60, state(60))
    assert kv.best(DIGEST, PROMPT[:60]) == (60, state(60))
    assert kv.best(DIGEST, PROMPT[:9]) is None
    assert kv.best(DIGEST, PROMPT, min_tokens=91) is None
    assert kv.best(DIGEST, PROMPT[:50], min_tokens=20) == (30, state(30))
    assert cache(tmp_path).best(DIGEST, PROMPT[:70]) == (60, state(60))


def test_another_models_entry_is_never_served(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:50], state(50))
    assert kv.best(OTHER, PROMPT) is None
    assert cache(tmp_path).best(OTHER, PROMPT) is None
    # even when its file is put in the other model's directory by hand
    moved = entry(kv, PROMPT[:50], OTHER)
    moved.parent.mkdir(parents=True)
    os.replace(entry(kv, PROMPT[:50]), moved)
    assert cache(tmp_path).best(OTHER, PROMPT) is None
    assert not moved.exists()  # detected, and deleted


def test_a_different_prefix_is_never_served(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:50], state(50))
    kv.save(DIGEST, PROMPT[:20], state(20))
    for k in (0, 19, 20, 35, 49):
        other = list(PROMPT)
        other[k] += 1
        expected = (20, state(20)) if k >= 20 else None
        assert kv.best(DIGEST, other) == expected, k


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 7)


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[2] ^= 0xFF  # the magic
    path.write_bytes(bytes(data))


def _wrong_tokens(path: Path) -> None:
    data = path.read_bytes()
    at = data.index(MAGIC) + len(MAGIC) + 4 + 2 + len(DIGEST) + 2 + 4 + 4 * 5
    bad = bytearray(data)
    bad[at] ^= 0x01  # the sixth stored token
    path.write_bytes(bytes(bad))


def _wrong_digest(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data.replace(DIGEST.encode(), OTHER.encode()))


def _version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(MAGIC)] = 99
    path.write_bytes(bytes(data))


CORRUPTIONS = [
    _flip_payload_byte,
    _truncate,
    _garble_header,
    _wrong_tokens,
    _wrong_digest,
    _version,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("fresh", [False, True], ids=["indexed", "after-restart"])
def test_a_corrupt_file_is_detected_removed_and_a_shorter_one_served(
    tmp_path: Path, corrupt: object, fresh: bool, caplog: pytest.LogCaptureFixture
) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:20], state(20))
    kv.save(DIGEST, PROMPT[:80], state(80))
    assert kv.best(DIGEST, PROMPT) == (80, state(80))  # the index is built
    bad = entry(kv, PROMPT[:80])
    assert callable(corrupt)
    corrupt(bad)
    if fresh:
        kv = cache(tmp_path)
    assert kv.best(DIGEST, PROMPT) == (20, state(20))
    assert not bad.exists()
    assert "corrupt" in caplog.text
    assert kv.counts["corrupt"] == 1
    assert kv.best(DIGEST, PROMPT) == (20, state(20))


def test_an_entry_of_another_engine_format_is_dropped(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:30], state(30), tag="llama.cpp 1")
    assert kv.best(DIGEST, PROMPT, tag="llama.cpp 1") == (30, state(30))
    assert kv.best(DIGEST, PROMPT, tag="llama.cpp 2") is None
    assert not entry(kv, PROMPT[:30]).exists()
    kv.save(DIGEST, PROMPT[:30], b"new", tag="llama.cpp 2")
    kv.save(DIGEST, PROMPT[:30], b"newer", tag="llama.cpp 3")  # another tag replaces it
    assert kv.best(DIGEST, PROMPT, tag="llama.cpp 3") == (30, b"newer")


def test_saving_an_existing_key_keeps_it_and_touches_it(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:30], state(30))
    path = entry(kv, PROMPT[:30])
    os.utime(path, (1000.0, 1000.0))
    kv.save(DIGEST, PROMPT[:30], b"something else")
    assert kv.best(DIGEST, PROMPT) == (30, state(30))
    assert path.stat().st_mtime > 1000.0


def test_a_hit_touches_the_entry(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:30], state(30))
    path = entry(kv, PROMPT[:30])
    os.utime(path, (1000.0, 1000.0))
    assert kv.best(DIGEST, PROMPT) is not None
    assert path.stat().st_mtime > 1000.0


def test_sweep_deletes_entries_unused_for_the_ttl(tmp_path: Path) -> None:
    kv = cache(tmp_path, ttl=3600)
    kv.save(DIGEST, PROMPT[:10], state(10))
    kv.save(DIGEST, PROMPT[:20], state(20))
    kv.save(OTHER, PROMPT[:30], state(30))
    assert kv.best(DIGEST, PROMPT[:15]) == (10, state(10))  # indexed before the sweep
    now = time.time()
    os.utime(entry(kv, PROMPT[:10]), (now - 7200, now - 7200))
    os.utime(entry(kv, PROMPT[:30], OTHER), (now - 7200, now - 7200))
    size = entry(kv, PROMPT[:10]).stat().st_size + entry(kv, PROMPT[:30], OTHER).stat().st_size

    assert kv.sweep(now) == size
    assert kv.best(DIGEST, PROMPT[:15]) is None
    assert kv.best(DIGEST, PROMPT) == (20, state(20))
    assert kv.best(OTHER, PROMPT) is None
    assert not (kv.root / dir_name(OTHER)).exists()  # an emptied model directory goes
    assert kv.sweep(now) == 0


def test_sweep_keeps_to_the_size_in_lru_order(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    then = time.time() - 100
    for i, n in enumerate((10, 20, 30, 40)):
        kv.save(DIGEST, PROMPT[:n], state(n))
        os.utime(entry(kv, PROMPT[:n]), (then + i, then + i))  # saved in this order
    sizes = {n: entry(kv, PROMPT[:n]).stat().st_size for n in (10, 20, 30, 40)}
    assert kv.best(DIGEST, PROMPT[:15]) == (10, state(10))  # 10 is now the most recent
    kv.max_bytes = sizes[10] + sizes[40] + 1

    assert kv.sweep() == sizes[20] + sizes[30]
    assert kv.usage() == sizes[10] + sizes[40]
    assert kv.best(DIGEST, PROMPT[:35]) == (10, state(10))
    assert kv.best(DIGEST, PROMPT) == (40, state(40))


def test_saving_past_the_size_evicts_the_least_recently_used(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:10], state(10))
    one = entry(kv, PROMPT[:10]).stat().st_size
    kv.max_bytes = 2 * one + 50
    then = time.time() - 100
    os.utime(entry(kv, PROMPT[:10]), (then, then))
    kv.save(DIGEST, PROMPT[:11], state(11))
    os.utime(entry(kv, PROMPT[:11]), (then + 1, then + 1))
    kv.save(DIGEST, PROMPT[:12], state(12))
    assert kv.usage() <= kv.max_bytes
    assert not entry(kv, PROMPT[:10]).exists()
    assert kv.best(DIGEST, PROMPT) == (12, state(12))
    assert kv.counts["evicted"] == 1


def test_an_entry_larger_than_the_cache_is_not_saved(tmp_path: Path) -> None:
    kv = cache(tmp_path, max_bytes=100)
    kv.save(DIGEST, PROMPT[:10], state(10))
    assert kv.best(DIGEST, PROMPT) is None
    off = cache(tmp_path, max_bytes=0)
    off.save(DIGEST, PROMPT[:10], b"x")
    assert off.best(DIGEST, PROMPT) is None


def test_sweep_removes_stray_temporary_files(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:10], state(10))
    stray = entry(kv, PROMPT[:10]).parent / f"{TEMP_PREFIX}dead{SUFFIX}"
    stray.write_bytes(b"half a state")
    young = stray.with_name(f"{TEMP_PREFIX}young{SUFFIX}")
    young.write_bytes(b"being written by another process")
    os.utime(stray, (time.time() - 3600, time.time() - 3600))
    assert kv.sweep() == len(b"half a state")
    assert not stray.exists()
    assert young.exists()
    assert kv.best(DIGEST, PROMPT) == (10, state(10))


def test_forget_drops_one_model(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:10], state(10))
    kv.save(OTHER, PROMPT[:10], state(10))
    assert kv.best(DIGEST, PROMPT) is not None
    assert kv.forget(DIGEST) > 0
    assert kv.best(DIGEST, PROMPT) is None
    assert kv.best(OTHER, PROMPT) == (10, state(10))
    kv.save(DIGEST, PROMPT[:10], state(10))  # and it can be saved again
    assert kv.best(DIGEST, PROMPT) == (10, state(10))


def test_entries_saved_by_another_instance_are_found(tmp_path: Path) -> None:
    engine, other = cache(tmp_path), cache(tmp_path)
    engine.save(DIGEST, PROMPT[:10], state(10))
    assert engine.best(DIGEST, PROMPT) == (10, state(10))
    other.save(DIGEST, PROMPT[:50], state(50))
    assert engine.best(DIGEST, PROMPT) == (50, state(50))
    other.forget(DIGEST)
    assert engine.best(DIGEST, PROMPT) is None


def test_an_unwritable_directory_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "kv"
    blocker.write_bytes(b"a file where the directory should be")
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:10], state(10))
    assert "could not save" in caplog.text
    assert kv.best(DIGEST, PROMPT) is None
    assert kv.sweep() == 0
    assert kv.counts["errors"] == 1

    blocker.unlink()
    kv.root.mkdir()
    kv.save(DIGEST, PROMPT[:10], state(10))
    if os.geteuid() != 0:  # root writes through permissions
        folder = entry(kv, PROMPT[:10]).parent
        folder.chmod(0o500)
        try:
            kv.save(DIGEST, PROMPT[:20], state(20))
            assert kv.counts["errors"] == 2
        finally:
            folder.chmod(0o700)
        assert [p.name for p in folder.iterdir()] == [entry(kv, PROMPT[:10]).name]
    assert kv.best(DIGEST, PROMPT) == (10, state(10))


def test_a_full_disk_leaves_no_partial_entry(tmp_path: Path) -> None:
    """A full disk often shows only at ``fsync`` (delayed allocation): the save must not
    raise, and leave neither an entry under the key nor its temporary file."""
    kv = cache(tmp_path)
    kv.save(DIGEST, PROMPT[:5], state(5))
    folder = entry(kv, PROMPT[:5]).parent

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "fsync", full)
    try:
        kv.save(DIGEST, PROMPT[:60], state(60) * 100)
    finally:
        mp.undo()
    assert kv.counts["errors"] == 1
    assert sorted(p.name for p in folder.iterdir()) == [entry(kv, PROMPT[:5]).name]
    assert kv.best(DIGEST, PROMPT) == (5, state(5))


def test_concurrent_saves_lookups_and_sweeps_do_not_corrupt(tmp_path: Path) -> None:
    kv = cache(tmp_path)
    lengths = list(range(5, 100, 5))
    errors: list[BaseException] = []
    served: list[tuple[int, bytes]] = []

    def saver(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                n = rng.choice(lengths)
                kv.save(DIGEST, PROMPT[:n], state(n))
        except BaseException as exc:
            errors.append(exc)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                got = kv.best(DIGEST, PROMPT[: rng.randint(1, 100)])
                if got is not None:
                    served.append(got)
        except BaseException as exc:
            errors.append(exc)

    def sweeper() -> None:
        try:
            for _ in range(20):
                kv.sweep()
                PrefixFiles(kv.root, max_bytes=GIB, ttl=86400).best(DIGEST, PROMPT)
        except BaseException as exc:
            errors.append(exc)

    # one entry before the threads start: on a busy machine the readers may otherwise
    # all run before any saver has saved, and serve nothing to check
    kv.save(DIGEST, PROMPT[:5], state(5))
    threads = [threading.Thread(target=saver, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(10 + i,)) for i in range(3)]
    threads.append(threading.Thread(target=sweeper))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert kv.counts["corrupt"] == 0
    assert all(payload == state(n) for n, payload in served)
    assert served
    fresh = cache(tmp_path)
    saved = {n for n in lengths if entry(kv, PROMPT[:n]).exists()}
    assert fresh.best(DIGEST, PROMPT) == (max(saved), state(max(saved)))
    assert not list(kv.root.rglob(f"{TEMP_PREFIX}*"))


tokens_st = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=24)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(saved=st.lists(tokens_st, max_size=8), query=tokens_st, min_tokens=st.integers(1, 4))
def test_best_is_exactly_the_longest_saved_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    saved: list[list[int]],
    query: list[int],
    min_tokens: int,
) -> None:
    kv = cache(tmp_path_factory.mktemp("kv"))
    for tokens in saved:
        kv.save(DIGEST, tokens, bytes(tokens) + b"|")
    prefixes = [t for t in saved if len(t) >= min_tokens and query[: len(t)] == t]
    got = kv.best(DIGEST, query, min_tokens=min_tokens)
    if not prefixes:
        assert got is None
    else:
        longest = max(prefixes, key=len)
        assert got == (len(longest), bytes(longest) + b"|")
    assert kv.best(OTHER, query) is None


def test_settings_from_the_environment(tmp_path: Path) -> None:
    s = config.from_env({"LMSP_DATA_DIR": str(tmp_path)})
    assert s.kv_dir == tmp_path / "kv"
    assert s.kv_cache_bytes == 2 * GIB
    assert s.kv_cache_ttl == 7 * 86400
    s = config.from_env({"LMSP_KV_CACHE_BYTES": "1000", "LMSP_KV_CACHE_TTL": "12h"})
    assert (s.kv_cache_bytes, s.kv_cache_ttl) == (1000, 12 * 3600)
    with pytest.raises(ValueError):
        config.from_env({"LMSP_KV_CACHE_BYTES": "-1"})
    with pytest.raises(ValueError):
        config.from_env({"LMSP_KV_CACHE_TTL": "soon"})
    s = config.from_env({"LMSP_KV_CACHE_RESERVE": "12345"})
    assert s.kv_cache_reserve == 12345 and config.Settings().kv_cache_reserve is None
    with pytest.raises(ValueError):
        config.from_env({"LMSP_KV_CACHE_RESERVE": "-5"})


# -- the free-space reserve (issue 17, finding 4) ------------------------------------------


class FakeDisk:
    """A disk of ``capacity`` bytes holding the cache's files and ``others`` bytes of
    something else (the database, another program)."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root = root
        self.capacity = capacity
        self.others = 0

    def __call__(self, path: Path) -> tuple[int, int]:
        used = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
        return max(0, self.capacity - used - self.others), self.capacity


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDisk:
    from lmsp.engines import kvfiles

    fake = FakeDisk(tmp_path / "kv", 200_000)
    monkeypatch.setattr(kvfiles, "_disk", fake)
    monkeypatch.setattr(kvfiles, "RELIEF_LEAST", 10_000)
    return fake


def big(n: int) -> bytes:
    return state(n) * 10  # about 10 KB


def test_the_default_reserve_is_a_tenth_of_the_disk(tmp_path: Path, disk: FakeDisk) -> None:
    assert cache(tmp_path).reserve == 20_000
    assert PrefixFiles(tmp_path / "kv", max_bytes=GIB, ttl=1, reserve=5).reserve == 5


def test_saves_keep_the_reserve_free_evicting_the_oldest(tmp_path: Path, disk: FakeDisk) -> None:
    kv = cache(tmp_path)
    for n in range(1, 40):
        kv.save(DIGEST, PROMPT[:n], big(n))
        assert disk(kv.root)[0] >= kv.reserve, n
    assert kv.counts["evicted_for_space"] > 0
    assert kv.best(DIGEST, PROMPT) is not None and kv.best(DIGEST, PROMPT)[0] == 39  # newest
    assert kv.best(DIGEST, PROMPT[:5], min_tokens=1) is None  # the oldest went


def test_a_save_that_cannot_keep_the_reserve_is_skipped(tmp_path: Path, disk: FakeDisk) -> None:
    kv = cache(tmp_path)
    disk.others = 175_000  # the database grew: 25 KB left, 20 KB reserved
    kv.save(DIGEST, PROMPT[:10], big(10))
    assert kv.counts["no_room"] == 1 and not list(kv.root.rglob("*.kv"))


def test_relieve_and_sweep_give_space_back(tmp_path: Path, disk: FakeDisk) -> None:
    kv = cache(tmp_path)
    for n in range(1, 12):
        kv.save(DIGEST, PROMPT[:n], big(n))
    held = len(list(kv.root.rglob("*.kv")))
    disk.others = disk(kv.root)[0]  # something else takes every free byte
    assert disk(kv.root)[0] == 0
    freed = kv.relieve()  # a durable write failed: the cache gives way
    assert freed > 0 and disk(kv.root)[0] >= kv.reserve
    assert 0 < len(list(kv.root.rglob("*.kv"))) < held
    disk.others += disk(kv.root)[0] - 1_000  # below the reserve again
    assert kv.sweep() > 0 and disk(kv.root)[0] >= kv.reserve


def test_a_write_that_finds_the_disk_full_is_retried_after_relief(tmp_path: Path) -> None:
    from lmsp.store.db import Database, Faults

    db = Database(tmp_path / "lmsp.db")
    relieved: list[int] = []

    def relief() -> int:
        relieved.append(1)
        return 4096

    try:
        db.relief = relief
        db.faults = Faults(jobs={1})  # the first attempt finds the disk full
        assert db.write_sync(lambda c: c.execute("SELECT 1").fetchone()[0]) == 1
        assert relieved == [1] and db.health.ok
        db.faults = Faults(all_writes=True)  # still full after relief: refused, degraded
        with pytest.raises(Exception) as caught:
            db.write_sync(lambda c: None)
        assert getattr(caught.value, "code", None) == "insufficient_storage"
        assert len(relieved) == 2 and not db.health.ok
    finally:
        db.close()
