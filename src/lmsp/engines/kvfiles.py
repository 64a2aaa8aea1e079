"""The durable prefix cache: KV state of token prefixes, kept as files in the data directory.

Why: an agent resends its system prompt, tools and history every turn. The engine keeps
the KV cells of recent prefixes in memory, but a restart loses them, and evaluating a long
prefix again costs seconds. This module keeps the engine's serialised sequence state
(``llama_state_seq_get_data`` bytes) on disk, keyed by model digest and token prefix, so
that after a restart the first request sharing a saved prefix restores it instead.

It knows nothing of llama.cpp: it stores and serves opaque bytes. It is an optimisation,
so it never fails its caller: a full disk is a warning and a miss, and a file that is not
exactly what was saved (torn, truncated, flipped bits, another model's, another prefix's)
is never served — every header field and the payload's SHA-256 are checked before the
bytes leave this module, and a file that fails is deleted.

Layout: ``root/<digest>/<sha256 of the tokens as int32 little-endian>.kv``, where
``<digest>`` is the model digest with ``:`` made ``-`` (as for blobs); the format of a
file is :mod:`lmsp.engines.kvformat`'s.

``tag`` is whatever the engine needs to equal for the bytes to be restorable (e.g. the
llama.cpp build and KV cache type); an entry saved under another tag is removed when met.

Files are written to a temporary name, fsynced and renamed into place, so a crash leaves
a whole entry or a stray temporary file (``sweep`` removes it), never a torn entry under
a key. Recency is the file's mtime, touched on every save and hit: ``sweep`` deletes
entries older than ``ttl`` and then the least recently used until the total fits
``max_bytes``.

The cache never takes the room durable writes need: it leaves ``reserve`` bytes free on
its disk (by default a tenth of the disk, at most 4 GiB). A save that would go below
the reserve first evicts the least recently used entries, and is skipped if that is not
enough; ``sweep`` evicts while the disk is below it (the database grew into it); and
when a durable write fails for lack of space anyway, the writer calls :meth:`relieve`,
which evicts until the reserve is free again (or the cache is empty), and retries.

One instance serves one process (the engine saves and looks up, the retention pass
sweeps) under one lock. Another instance on the same root stays correct: each index
re-reads its directory when the directory's mtime changes, and every read is verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsp.engines.kvformat import (
    KEY,
    MAGIC,
    SUFFIX,
    TAIL,
    Corrupt,
    dir_name,
    encode_header,
    exactly,
    prefix_key,
    read_header,
    token_bytes,
)

log = logging.getLogger("lmsp")

__all__ = ["MAGIC", "SUFFIX", "TEMP_PREFIX", "PrefixFiles", "dir_name", "prefix_key"]

TEMP_PREFIX = ".tmp-"
# a temporary file this old is stray (its writer died), not one being written elsewhere
TEMP_GRACE = 600.0
# the default free-space reserve: this share of the disk, at most RESERVE_MOST bytes
RESERVE_SHARE = 10
RESERVE_MOST = 4 << 30
# what :meth:`PrefixFiles.relieve` frees at least (even with no reserve set)
RELIEF_LEAST = 8 << 20


@dataclass
class _Index:
    """Saved entries of one model digest: stored length → keys, and back."""

    stamp: int  # the directory's mtime (ns) when last read
    by_len: dict[int, set[str]] = field(default_factory=dict)
    n_of: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, n: int) -> None:
        self.n_of[key] = n
        self.by_len.setdefault(n, set()).add(key)

    def drop(self, key: str) -> None:
        n = self.n_of.pop(key, None)
        if n is None:
            return
        keys = self.by_len.get(n)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_len[n]


class PrefixFiles:
    """Content-addressed KV state of token prefixes, per model digest (see the module
    docstring). Thread-safe; every public method is safe to call at any time and none
    raises on an I/O error."""

    def __init__(
        self, root: Path, *, max_bytes: int, ttl: float, reserve: int | None = None
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._reserve = reserve  # None: from the disk's size, once it is known
        # saved, hits, misses, corrupt, stale, evicted, errors: for metrics and tests
        self.counts: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._indexes: dict[str, _Index] = {}
        self._writing: set[str] = set()  # temporary file names this instance is writing
        self._total: int | None = None  # bytes of entries, once counted

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled for an engine process: the same directory and limits, a fresh
        instance there (another instance on the same root stays correct)."""
        return (_reopen, (self.root, self.max_bytes, self.ttl, self._reserve))

    # -- saving ------------------------------------------------------------------------
    def save(self, model_digest: str, tokens: Sequence[int], data: bytes, *, tag: str = "") -> None:
        """Keep ``data`` as the state after ``tokens`` for this model. An entry already
        saved under the key is kept (its mtime touched), unless its tag differs."""
        if not tokens:
            return
        raw = token_bytes(tokens)
        key = hashlib.sha256(raw).hexdigest()
        header = encode_header(model_digest, tag, raw, data)
        size = len(header) + len(data)
        if size > self.max_bytes:
            return  # the cache is off, or one entry would not fit it
        if not self._room_for(size):
            with self._lock:
                self.counts["no_room"] += 1
            return  # the disk keeps its reserve for durable writes
        name = dir_name(model_digest)
        folder = self.root / name
        path = folder / f"{key}{SUFFIX}"
        tmp = folder / f"{TEMP_PREFIX}{secrets.token_hex(8)}{SUFFIX}"
        try:
            with self._lock:
                if self._keep_existing(path, model_digest, tag, len(tokens)):
                    return
                # the temporary file is made under the lock, so no sweep removes the
                # directory between its creation and ours
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                folder.mkdir(mode=0o700, exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                self._writing.add(tmp.name)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(header)
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                with self._lock:
                    old = _size_or_zero(path)
                    os.replace(tmp, path)
                    _fsync_dir(folder)
                    index = self._indexes.get(name)
                    if index is not None:
                        index.add(key, len(tokens))
                        index.stamp = _mtime_ns(folder)
                    if self._total is not None:
                        self._total += size - old
                    self.counts["saved"] += 1
            finally:
                with self._lock:
                    self._writing.discard(tmp.name)
        except OSError as exc:
            with self._lock:
                self.counts["errors"] += 1
            log.warning(
                "prefix cache: could not save %d tokens of %s: %s",
                len(tokens),
                model_digest,
                exc,
                extra={"event": "kv.save_failed"},
            )
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        if self._over_budget():
            self.sweep()

    def _keep_existing(self, path: Path, model_digest: str, tag: str, n: int) -> bool:
        """True if ``path`` already holds this entry (its mtime is then touched)."""
        try:
            with path.open("rb") as f:
                head = read_header(f)
        except FileNotFoundError:
            return False
        except (OSError, Corrupt, struct.error):
            return False  # replaced by the save; a bad payload is found when read
        if (head.digest, head.tag, head.n_tokens) != (model_digest, tag, n):
            return False
        with contextlib.suppress(OSError):
            os.utime(path)
        return True

    def _over_budget(self) -> bool:
        with self._lock:
            if self._total is None:
                self._total = self._usage()
            return self._total > self.max_bytes

    # -- free space --------------------------------------------------------------------
    @property
    def reserve(self) -> int:
        """Bytes the cache leaves free on its disk."""
        if self._reserve is None:
            disk = _disk(self.root)
            if disk is None or disk[1] <= 0:
                return 0  # the disk cannot be measured yet: try again next time
            self._reserve = min(disk[1] // RESERVE_SHARE, RESERVE_MOST)
        return self._reserve

    def _room_for(self, size: int) -> bool:
        """Whether ``size`` more bytes leave the reserve free, evicting the least
        recently used entries as needed (``True`` if the disk cannot be measured)."""
        if _free(self.root, default=size + self.reserve) - size >= self.reserve:
            return True
        self._evict_for(size + self.reserve)
        return _free(self.root, default=0) - size >= self.reserve

    def relieve(self) -> int:
        """A durable write failed for lack of space: evict the least recently used
        entries until the reserve is free again (at least :data:`RELIEF_LEAST` bytes;
        all of them if need be); the bytes freed. Never raises."""
        try:
            freed = self._evict_for(max(self.reserve, RELIEF_LEAST))
        except Exception:  # pragma: no cover - the writer's last resort must not raise
            log.exception("prefix cache: relieving the disk failed")
            return 0
        if freed:
            log.warning(
                "prefix cache: %d bytes evicted, the disk was full",
                freed,
                extra={"event": "kv.relieved"},
            )
        return freed

    def _evict_for(self, wanted: int) -> int:
        """Evict in LRU order until ``wanted`` bytes are free on the disk."""
        freed = 0
        with self._lock:
            for _, _, name, key in self._entries():
                if _free(self.root, default=wanted) >= wanted:
                    break
                freed += self._remove(name, key)
                self.counts["evicted_for_space"] += 1
        return freed

    def _entries(self) -> list[tuple[float, int, str, str]]:
        """Every entry as ``(mtime, size, dir name, key)``, least recently used first."""
        live: list[tuple[float, int, str, str]] = []
        for folder, entry, st in _scan(self.root):
            key = entry.name.removesuffix(SUFFIX)
            if not entry.name.startswith(TEMP_PREFIX) and KEY.match(key):
                live.append((st.st_mtime, st.st_size, folder.name, key))
        live.sort()
        return live

    # -- looking up --------------------------------------------------------------------
    def best(
        self, model_digest: str, tokens: Sequence[int], *, min_tokens: int = 1, tag: str = ""
    ) -> tuple[int, bytes] | None:
        """The longest saved prefix of ``tokens`` (``n <= len(tokens)``, ``n >=
        min_tokens``) for this model and tag, as ``(n, payload)``, checked byte for byte;
        ``None`` if there is none. A file that fails a check is deleted and the next
        longest tried."""
        if len(tokens) < max(min_tokens, 1):
            return None
        raw = memoryview(token_bytes(tokens))
        name = dir_name(model_digest)
        with self._lock:
            index = self._index(name, model_digest)
            lengths = sorted(n for n in index.by_len if max(min_tokens, 1) <= n <= len(tokens))
            keys: list[tuple[int, str]] = []
            running = hashlib.sha256()
            done = 0
            for n in lengths:  # one pass over the tokens, a digest at each stored length
                running.update(raw[done * 4 : n * 4])
                done = n
                keys.append((n, running.copy().hexdigest()))
            for n, key in reversed(keys):
                if key not in index.by_len.get(n, ()):
                    continue
                payload = self._load(name, key, model_digest, tag, raw[: n * 4])
                if payload is not None:
                    self.counts["hits"] += 1
                    return n, payload
            self.counts["misses"] += 1
        return None

    def _load(
        self, name: str, key: str, model_digest: str, tag: str, raw_prefix: memoryview
    ) -> bytes | None:
        """The payload of one entry if every check passes, else ``None`` (the file then
        deleted, unless it vanished or could not be read)."""
        path = self.root / name / f"{key}{SUFFIX}"
        try:
            with path.open("rb") as f:
                head = read_header(f)
                if head.digest != model_digest:
                    raise Corrupt("another model's digest")
                if head.n_tokens * 4 != len(raw_prefix):
                    raise Corrupt("another token count")
                if raw_prefix != exactly(f, len(raw_prefix)):
                    raise Corrupt("other tokens")
                length, checksum = TAIL.unpack(exactly(f, TAIL.size))
                if os.fstat(f.fileno()).st_size != f.tell() + length:
                    raise Corrupt("payload length")
                if head.tag != tag:
                    self.counts["stale"] += 1
                    log.info(
                        "prefix cache: dropping an entry saved by another engine state format",
                        extra={"event": "kv.stale"},
                    )
                    self._remove(name, key)
                    return None
                payload = exactly(f, length)
                if hashlib.sha256(payload).digest() != checksum:
                    raise Corrupt("payload checksum")
        except FileNotFoundError:
            self._forget_key(name, key)
            return None
        except (Corrupt, struct.error) as exc:
            self._corrupt(path.name, exc)
            self._remove(name, key)
            return None
        except OSError as exc:
            self.counts["errors"] += 1
            log.warning(
                "prefix cache: cannot read %s: %s", path.name, exc, extra={"event": "kv.error"}
            )
            self._forget_key(name, key)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return payload

    def _index(self, name: str, model_digest: str) -> _Index:
        """The digest's index, (re)built from headers when its directory changed."""
        folder = self.root / name
        stamp = _mtime_ns(folder)
        index = self._indexes.get(name)
        if index is not None and index.stamp == stamp:
            return index
        index = _Index(stamp)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            entries = []
        for entry in entries:
            key = entry.name.removesuffix(SUFFIX)
            if not entry.name.endswith(SUFFIX) or not KEY.match(key):
                continue
            try:
                with open(entry.path, "rb") as f:
                    head = read_header(f)
                if head.digest != model_digest:
                    raise Corrupt("another model's digest")
            except (Corrupt, struct.error) as exc:
                self._corrupt(entry.name, exc)
                self._unlink(Path(entry.path))
                continue
            except OSError:
                continue
            index.add(key, head.n_tokens)
        # the stamp from before the scan: a change made meanwhile is read next time
        self._indexes[name] = index
        return index

    # -- removing ----------------------------------------------------------------------
    def _forget_key(self, name: str, key: str) -> None:
        index = self._indexes.get(name)
        if index is not None:
            index.drop(key)

    def _corrupt(self, file_name: str, problem: Exception) -> None:
        """Count and report a file that failed its checks (the caller deletes it)."""
        self.counts["corrupt"] += 1
        log.warning(
            "prefix cache: %s is corrupt (%s); deleted",
            file_name,
            problem,
            extra={"event": "kv.corrupt"},
        )

    def _remove(self, name: str, key: str) -> int:
        """Delete one entry and its index line; the bytes freed."""
        self._forget_key(name, key)
        freed = self._unlink(self.root / name / f"{key}{SUFFIX}")
        index = self._indexes.get(name)
        if index is not None:
            index.stamp = _mtime_ns(self.root / name)
        return freed

    def _unlink(self, path: Path) -> int:
        size = _size_or_zero(path)
        try:
            path.unlink()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("prefix cache: cannot delete %s: %s", path.name, exc)
            return 0
        if self._total is not None and not path.name.startswith(TEMP_PREFIX):
            self._total = max(0, self._total - size)
        return size

    def forget(self, model_digest: str) -> int:
        """Delete every entry of a model (it was deleted); the bytes freed."""
        name = dir_name(model_digest)
        with self._lock:
            folder = self.root / name
            freed = sum(_size_or_zero(p) for p in folder.glob("*")) if folder.is_dir() else 0
            shutil.rmtree(folder, ignore_errors=True)
            self._indexes.pop(name, None)
            self._total = None
            return freed

    def keep_only(self, model_digests: set[str]) -> int:
        """Delete the entries of every model not in ``model_digests`` (the digests model
        records name: a model deleted without :meth:`forget`, e.g. by a crash between
        the two); the bytes freed."""
        keep = {dir_name(d) for d in model_digests}
        freed = 0
        with self._lock:
            for folder in _subdirs(self.root):
                if folder.name not in keep:
                    freed += sum(_size_or_zero(p) for p in folder.glob("*"))
                    shutil.rmtree(folder, ignore_errors=True)
                    self._indexes.pop(folder.name, None)
                    self._total = None
        return freed

    def sweep(self, now: float | None = None) -> int:
        """Delete entries unused for ``ttl``, stray temporary files, then the least
        recently used entries until the total fits ``max_bytes``; the bytes freed."""
        stamp = time.time() if now is None else now
        freed = 0
        with self._lock:
            live: list[tuple[float, int, str, str]] = []  # mtime, size, dir name, key
            for folder, entry, st in _scan(self.root):
                if entry.name.startswith(TEMP_PREFIX):
                    if entry.name not in self._writing and st.st_mtime < stamp - TEMP_GRACE:
                        freed += self._unlink(Path(entry.path))
                    continue
                key = entry.name.removesuffix(SUFFIX)
                if not entry.name.endswith(SUFFIX) or not KEY.match(key):
                    continue
                if st.st_mtime < stamp - self.ttl:
                    freed += self._remove(folder.name, key)
                    self.counts["expired"] += 1
                else:
                    live.append((st.st_mtime, st.st_size, folder.name, key))
            total = sum(size for _, size, _, _ in live)
            live.sort()
            for _, size, name, key in live:
                if total <= self.max_bytes:
                    break
                freed += self._remove(name, key)
                total -= size
                self.counts["evicted"] += 1
            self._total = total
            freed += self._evict_for(self.reserve)  # the disk went below it meanwhile
            for folder in _subdirs(self.root):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty
            if freed:
                self._total = self._usage()
        return freed

    def _usage(self) -> int:
        total = 0
        for folder in _subdirs(self.root):
            with contextlib.suppress(OSError):
                for entry in os.scandir(folder):
                    if entry.name.endswith(SUFFIX) and not entry.name.startswith(TEMP_PREFIX):
                        with contextlib.suppress(OSError):
                            total += entry.stat().st_size
        return total

    def usage(self) -> int:
        """Bytes of saved entries (a directory scan)."""
        with self._lock:
            self._total = self._usage()
            return self._total


def _disk(path: Path) -> tuple[int, int] | None:
    """``(free bytes, total bytes)`` of the disk holding ``path`` (or the nearest
    directory above it that exists); ``None`` if it cannot be read."""
    for place in (path, *path.parents):
        try:
            st = os.statvfs(place)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return None


def _free(path: Path, *, default: int) -> int:
    disk = _disk(path)
    return default if disk is None else disk[0]


def _scan(root: Path) -> Iterator[tuple[Path, os.DirEntry[str], os.stat_result]]:
    """Every file of every model directory, with its ``stat`` (unreadable ones left out)."""
    for folder in _subdirs(root):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat()
            except OSError:
                continue
            yield folder, entry, st


def _reopen(root: Path, max_bytes: int, ttl: float, reserve: int | None) -> PrefixFiles:
    return PrefixFiles(root, max_bytes=max_bytes, ttl=ttl, reserve=reserve)


def _subdirs(root: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
