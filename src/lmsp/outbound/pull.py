"""The downloader: runs the tasks that pull a model from the hub (PROTOCOL.md section 12).

A pull task is claimed like any task (by the runner, which hands it here, or by this
downloader's own claim of pull tasks: on a database nodes share, a pull runs on the
node whose data directory it fills). It runs on a thread of its own, so a download of
gigabytes never holds one of the engine's sequence slots.

Each file goes into ``pulls/<task id>/<n>.part`` in the data directory, hashed (SHA-256)
while it arrives. About twice a second the bytes written so far are synced and a
``model.pull.progress`` event records them (``bytes``, ``total``, ``rate``) with the
point a resume starts from; that write is conditional on the task still ``running``, so
a committed cancel stops it (at once: the cancel shuts the hub's connection down, so a
read from a hub that trickles does not hold it; the shutdown alike). An attempt that
ends short of the file (a cut connection, a ``416``, an empty or short body) is retried
with ``Range`` from the bytes on disk after a back-off, at most :data:`MAX_FAILURES`
times in a row. After a restart (``kill -9`` included) the pull resumes (its
``on_restart`` is ``resume``): the part file is cut back to the last recorded point,
those bytes are hashed again (the hash state survives the restart that way) and the
download asks for the rest.

A file whose SHA-256 differs from the hub's LFS oid fails the task with
``digest_mismatch``; a full disk fails it with ``insufficient_storage``; a cancel ends it
``cancelled``: each time the part files are deleted. A verified file becomes a blob
(``blobs/sha256-<hex>``) and the model is registered in the transaction that completes
the task. A file already in the blob store is not fetched again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from prometheus_client.core import Metric

from lmsp import errors
from lmsp.datadir import ensure_private_dir
from lmsp.gguf import NotGGUF, check_structure, metadata_of, read_header_from
from lmsp.metrics import Metrics, per_model
from lmsp.outbound.hub import FailedAttempt, Hub
from lmsp.store import blobs, nodes, pulls, retrying
from lmsp.store import tasks as task_store
from lmsp.store.db import Database
from lmsp.store.health import is_storage_error
from lmsp.store.nodes import Node
from lmsp.store.pulls import HubFile, Pull
from lmsp.store.sql import Conn

log = logging.getLogger(__name__)

#: seconds between two progress events of one pull (each syncs the part file first)
PROGRESS_INTERVAL = 0.5
#: failed attempts in a row before a pull fails (a cut that brought bytes counts from 1 again)
MAX_FAILURES = 8
#: pulls that download at once on one node
MAX_ACTIVE = 2


class _Stop(Exception):
    """The pull stops where it is: a cancel committed, or the service shuts down."""

    def __init__(self, cancelled: bool) -> None:
        super().__init__("cancelled" if cancelled else "shutdown")
        self.cancelled = cancelled


class Downloader:
    def __init__(
        self,
        db: Database,
        data_dir: Path,
        endpoint: str,
        token: str | None = None,
        *,
        node: str = "",
        metrics: Metrics | None = None,
    ) -> None:
        self.db = db
        self.blobs_dir = data_dir / "blobs"
        self.work_dir = data_dir / "pulls"
        self.endpoint = endpoint
        self._token = token
        self.node = node  # '' on a database of one node
        # this node under its lease on a database nodes share (the runner's)
        self.owner: Callable[[], Node | None] = lambda: None
        self._active: set[str] = set()
        self._cancels: set[str] = set()
        self._hubs: dict[str, Hub] = {}  # the hub client of each pull downloading
        self._lock = threading.Lock()
        self._wake = threading.Condition()
        self._shutdown = threading.Event()
        self._threads: list[threading.Thread] = []
        if metrics is not None:
            metrics.add_collector(self.figures)

    def hub(self) -> Hub:
        return Hub(self.endpoint, self._token)

    # -- control ---------------------------------------------------------------------------
    def start(self) -> None:
        thread = threading.Thread(target=self._claim_loop, name="lmsp-pulls", daemon=True)
        thread.start()
        self._threads.append(thread)

    def notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def stop(self, timeout: float = 10) -> None:
        """Shut down: pulls stop where they are (their bytes stay on disk, their state
        for startup recovery)."""
        self._shutdown.set()
        self.notify()
        for hub in list(self._hubs.values()):
            hub.abort()  # a read from a hub that trickles returns now
        for thread in list(self._threads):
            thread.join(timeout)
        self._threads.clear()

    def cancel(self, task_id: str) -> None:
        """A cancel committed: the pull stops now (its connection to the hub is shut
        down, so it does not wait for the next chunk). Nothing for a pull not here."""
        with self._lock:
            if task_id not in self._active:
                return
            self._cancels.add(task_id)
        hub = self._hubs.get(task_id)
        if hub is not None:
            hub.abort()

    def take(self, task_id: str, resumed: bool) -> bool:
        """Run ``task_id`` if it is a pull (claimed already: ``loading``, or ``running``
        to resume); ``False`` if it is not one."""
        if not pulls.is_pull(self.db.reader(), task_id):
            return False
        self._spawn(task_id, resumed)
        return True

    def _spawn(self, task_id: str, resumed: bool) -> None:
        with self._lock:
            if task_id in self._active:
                return
            self._active.add(task_id)
        thread = threading.Thread(
            target=self._run, args=(task_id, resumed), name=f"lmsp-pull-{task_id}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _claim_loop(self) -> None:
        swept = 0.0
        while not self._shutdown.is_set():
            claimed = None
            if len(self._active) < MAX_ACTIVE and self.db.health.ok:
                try:  # a read first: a look that finds nothing costs the writer nothing
                    if pulls.waiting(self.db.reader(), shared=self.owner() is not None):
                        claimed = self.db.write_sync(
                            lambda c: pulls.claim(c, self.node, self.owner())
                        )
                except Exception as exc:  # a full disk: the next round tries again
                    if not is_storage_error(exc):
                        log.exception("claiming a pull failed")
            if claimed is not None:
                self._spawn(*claimed)
                continue
            if time.monotonic() - swept > 5:
                swept = time.monotonic()
                self.sweep()
            with self._wake:
                self._wake.wait(1.0)

    def sweep(self) -> list[Path]:
        """Delete the part files of pulls that are finished or gone (a pull cancelled
        while queued after a restart left its bytes; a crash after its end)."""
        if not self.work_dir.is_dir():
            return []
        gone = []
        conn = self.db.reader()
        for path in self.work_dir.iterdir():
            if path.name in self._active:
                continue
            task = task_store.get(conn, path.name)
            if task is None or task.status.terminal:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path)
        return gone

    # -- one pull ----------------------------------------------------------------------------
    def _write(self, task_id: str, job: Callable[[Conn], Any]) -> Any:
        owner = self.owner()

        def fenced(conn: Conn) -> Any:
            if owner is not None:
                nodes.fence(conn, task_id, owner)
            return job(conn)

        return self.db.write_sync(fenced)

    def _end(self, task_id: str, job: Callable[[Conn], Any]) -> Any:
        """A terminal write, retried while the disk is full."""
        owner = self.owner()

        def fenced(conn: Conn) -> Any:
            if owner is not None:
                nodes.fence(conn, task_id, owner)
            return job(conn)

        return retrying.write_until_done(self.db, fenced, self._shutdown, f"pull {task_id}")[1]

    def _run(self, task_id: str, resumed: bool) -> None:
        work = self.work_dir / task_id
        try:
            self._pull(task_id, resumed, work)
        except _Stop as stop:
            if stop.cancelled:
                shutil.rmtree(work, ignore_errors=True)
                self._end(task_id, lambda c: task_store.finish_cancel(c, task_id))
            else:
                log.info(
                    "pull %s: stopped for the shutdown (it resumes at the next start)",
                    task_id,
                    extra={"task_id": task_id, "event": "model.pull.stopped"},
                )
        except nodes.LeaseLost:
            log.warning("pull %s: this node no longer holds it", task_id)
        except Exception as exc:
            if self._shutdown.is_set():
                return  # its bytes stay: recovery resumes it
            code, message = _failure(exc)
            shutil.rmtree(work, ignore_errors=True)
            log.warning(
                "pull %s failed: %s",
                task_id,
                message,
                extra={"task_id": task_id, "event": "model.pull.failed", "error_code": code},
            )

            def fail(conn: Conn) -> None:
                task_store.fail(conn, task_id, code, message)
                task_store.finish_cancel(conn, task_id)  # a cancel that came first wins

            self._end(task_id, fail)
        finally:
            with self._lock:
                self._active.discard(task_id)
                self._cancels.discard(task_id)
                self._hubs.pop(task_id, None)
            self.notify()

    def _pull(self, task_id: str, resumed: bool, work: Path) -> None:
        pull = pulls.get(self.db.reader(), task_id)
        assert pull is not None
        if resumed:
            started = self._write(task_id, lambda c: task_store.mark_resumed(c, task_id, None))
        else:
            started = self._write(task_id, lambda c: task_store.start(c, task_id, None))
        if not started:
            raise _Stop(cancelled=True)  # a cancel won before the start
        log.info(
            "pull %s of %s: %d file(s), %d bytes%s",
            task_id,
            pull.ref,
            len(pull.files),
            pull.total_bytes,
            " (resumed)" if resumed else "",
            extra={"task_id": task_id, "event": "model.pull.started"},
        )
        work.mkdir(parents=True, exist_ok=True)
        done = 0
        with self.hub() as hub:
            self._hubs[task_id] = hub  # then checked: a cancel either sees it or is seen
            self._check(task_id)
            for index, file in enumerate(pull.files):
                blob = blobs.blob_path(self.blobs_dir, file.digest)
                ready = work / f"{index}.ok"
                if _has_size(blob, file.size) or _has_size(ready, file.size):
                    done += file.size  # in the blob store already (or verified): not fetched
                    continue
                keep = pull.part_bytes if index == pull.part else 0
                self._fetch(hub, pull, index, file, work / f"{index}.part", keep, done)
                done += file.size
        self._register(pull, work)

    def _fetch(
        self, hub: Hub, pull: Pull, index: int, file: HubFile, path: Path, keep: int, before: int
    ) -> None:
        """Download one file into ``path`` from byte ``keep`` (what a progress event
        recorded), hashing every byte; rename it ``<n>.ok`` once its SHA-256 is the hub's.

        Each attempt that ends short of the file is a failed one, followed by a back-off
        (0.4 s, doubling, at most 5 s): a cut connection (counted again from one when it
        brought bytes), and any answer that ends the file early — a ``416``, an empty or
        short body, an error status — whatever it brought. After :data:`MAX_FAILURES`
        in a row the pull fails, naming what the hub did last."""
        task_id = pull.task_id
        url = hub.file_url(pull.repo, pull.revision, file.path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with _Part(os.fdopen(fd, "r+b", buffering=0), keep, file.size) as part:
            failures = 0
            while part.pos < file.size:
                self._check(task_id)
                began = part.pos
                try:
                    self._attempt(hub, url, pull, index, file, part, before)
                    if part.pos >= file.size:
                        break
                    failed = FailedAttempt(
                        f"its answer ended at byte {part.pos:,}"
                        if part.pos > began
                        else f"it sent no byte from byte {began:,}"
                    )
                except FailedAttempt as exc:
                    self._check(task_id)  # a cancel or the shutdown closed the connection
                    failed = exc
                failures = 1 if failed.link and part.pos > began else failures + 1
                if failures >= MAX_FAILURES:
                    raise _gave_up(file, failed, part.pos) from None
                log.info(
                    "pull %s: the download of %s stopped at %d of %d bytes (%s); resuming",
                    task_id,
                    file.path,
                    part.pos,
                    file.size,
                    failed.what,
                    extra={"task_id": task_id, "event": "model.pull.retry"},
                )
                hub.aborted.wait(min(0.2 * 2**failures, 5.0))  # a cancel wakes it
            os.fsync(part.out.fileno())
        got = part.sha.hexdigest()
        if got != file.sha256:
            path.unlink(missing_ok=True)
            raise _mismatch(file, f"its SHA-256 is {got}")
        os.replace(path, path.with_suffix(".ok"))

    def _attempt(
        self, hub: Hub, url: str, pull: Pull, index: int, file: HubFile, part: _Part, before: int
    ) -> None:
        """One request for the rest of ``file``: its bytes written to ``part`` and
        hashed, a progress event about twice a second."""
        with hub.open_range(url, part.pos) as (offset, chunks):
            if offset != part.pos:  # the whole file again: start over
                part.restart()
            for chunk in chunks:
                if part.pos + len(chunk) > file.size:
                    raise _mismatch(file, "more bytes than the hub lists")
                part.add(chunk)
                now = time.monotonic()
                if now - part.last >= PROGRESS_INTERVAL:
                    os.fsync(part.out.fileno())
                    rate = (part.pos - part.last_pos) / (now - part.last)
                    if not self._progress(pull, index, part.pos, before, rate):
                        raise _Stop(cancelled=True)
                    part.last, part.last_pos = now, part.pos
                self._check(pull.task_id)

    def _progress(self, pull: Pull, index: int, pos: int, before: int, rate: float) -> bool:
        """Record ``pos`` synced bytes of file ``index`` (and log the progress event);
        ``False`` once the task is no longer running."""
        task_id, total = pull.task_id, pull.total_bytes
        return bool(
            self._write(
                task_id,
                lambda c: pulls.progress(c, task_id, index, pos, before + pos, total, rate),
            )
        )

    def _check(self, task_id: str) -> None:
        if task_id in self._cancels:
            raise _Stop(cancelled=True)
        if self._shutdown.is_set():
            raise _Stop(cancelled=False)

    def _register(self, pull: Pull, work: Path) -> None:
        """Every file verified: the first one's GGUF header gives the model's metadata
        (its chat template included); the files become blobs and the model is registered
        in the transaction that completes the task."""
        first = pull.files[0]
        first_path = _located(self.blobs_dir, work, 0, first)
        try:
            with first_path.open("rb") as fh:
                whole = len(pull.files) == 1  # one file: its layout is checked too
                meta = metadata_of(
                    check_structure(fh, first.size) if whole else read_header_from(fh)
                )
        except NotGGUF as exc:
            raise errors.LmspError("invalid_model_file", f"Not a whole GGUF file: {exc}") from None
        meta.update(
            {
                "source": pull.ref,
                "source_file": first.path.rsplit("/", 1)[-1],
                "revision": pull.revision,
                "quant_tag": pull.quant,
            }
        )
        if len(pull.files) > 1:
            meta["parts"] = [
                {"file": f.path.rsplit("/", 1)[-1], "digest": f.digest, "size": f.size}
                for f in pull.files
            ]
        ensure_private_dir(self.blobs_dir)
        with blobs.blob_lock:
            for index, file in enumerate(pull.files):
                ready = work / f"{index}.ok"
                target = blobs.blob_path(self.blobs_dir, file.digest)
                if ready.exists():
                    if _has_size(target, file.size):
                        ready.unlink()
                    else:
                        os.replace(ready, target)
            outcome: str | None = None
            try:
                outcome = self._end(
                    pull.task_id,
                    lambda c: pulls.finish(
                        c, pull, digest=first.digest, size=first.size, metadata=meta
                    ),
                )
            finally:
                if outcome != "completed":  # no record names them: they go
                    for file in pull.files:
                        blobs.remove_unreferenced(self.db, self.blobs_dir, file.digest)
        shutil.rmtree(work, ignore_errors=True)
        log.info(
            "pull %s: %s",
            pull.task_id,
            outcome,
            extra={"task_id": pull.task_id, "event": "model.pull.ended", "model": pull.model_id},
        )

    # -- figures -------------------------------------------------------------------------------
    def figures(self) -> list[Metric]:
        rows = pulls.active(self.db.reader())
        return [
            per_model(
                "lmsp_model_pull_bytes",
                "Bytes a model pull in progress has on disk.",
                ((row["model_id"], float(row["bytes_done"])) for row in rows),
            ),
            per_model(
                "lmsp_model_pull_total_bytes",
                "Bytes a model pull in progress fetches.",
                ((row["model_id"], float(row["total_bytes"])) for row in rows),
            ),
        ]


class _Part:
    """A file being downloaded: its part file (open), the hash of the bytes in it and
    how far it got. Opened from the point a progress event recorded: the bytes past it
    are cut off and the hash state is rebuilt from those before it."""

    def __init__(self, out: BinaryIO, keep: int, size: int) -> None:
        self.out = out
        self.sha = Hasher()
        self.pos = min(keep, os.fstat(out.fileno()).st_size, size)
        out.truncate(self.pos)  # bytes past the last recorded point are fetched again
        while out.tell() < self.pos:  # the hash state is rebuilt from the bytes on disk
            self.sha.update(out.read(min(blobs.CHUNK, self.pos - out.tell())))
        out.seek(self.pos)
        self.written = self.pos  # where the last writeback to the disk began
        self.last = time.monotonic()  # the last progress event
        self.last_pos = self.pos

    def __enter__(self) -> _Part:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sha.close()
        self.out.close()

    def add(self, chunk: bytes) -> None:
        self.sha.update(chunk)
        blobs.write_chunk(self.out, chunk)
        self.pos += len(chunk)
        if self.pos - self.written >= blobs.WRITEBACK:
            blobs.start_writeback(self.out.fileno(), self.written, self.pos)
            self.written = self.pos

    def restart(self) -> None:
        """From byte 0 again (the hub sent the whole file)."""
        self.out.seek(0)
        self.out.truncate(0)
        self.sha.reset()
        self.pos = self.written = 0


class Hasher:
    """SHA-256 on a thread of its own, fed in order through a short queue: the next read
    from the network overlaps the hashing of the chunks before it (``hashlib`` lets go of
    the GIL on large buffers), so a pull costs one pass over the bytes, not two."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._thread: threading.Thread | None = None
        self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lmsp-pull-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._sha.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def close(self) -> None:
        """Hash what was fed and stop the thread (again: nothing)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def reset(self) -> None:
        """Start over from byte 0."""
        self.close()
        self._sha = hashlib.sha256()
        self._start()

    def hexdigest(self) -> str:
        self.close()
        return self._sha.hexdigest()


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _located(blobs_dir: Path, work: Path, index: int, file: HubFile) -> Path:
    ready = work / f"{index}.ok"
    return ready if ready.exists() else blobs.blob_path(blobs_dir, file.digest)


def _mismatch(file: HubFile, why: str) -> errors.LmspError:
    return errors.LmspError(
        "digest_mismatch",
        f"{file.path} does not match the hub's SHA-256 {file.sha256} ({why}); nothing was kept.",
    )


def _gave_up(file: HubFile, failed: FailedAttempt, pos: int) -> errors.LmspError:
    """The pull's error after :data:`MAX_FAILURES` failed attempts in a row at ``file``:
    ``hub_unavailable`` when the link broke, else ``hub_error``; the message names what
    the hub did."""
    if failed.link:
        what = f"the model hub cannot be reached: {failed.what}"
        code = "hub_unavailable"
    else:
        what = f"the hub lists {file.size:,} bytes for it, but {failed.what}"
        code = "hub_error"
    return errors.LmspError(
        code,
        f"{file.path} stopped at byte {pos:,} after {MAX_FAILURES} failed attempts in a row"
        f" ({what}); nothing was kept.",
    )


def _failure(exc: BaseException) -> tuple[str, str]:
    """A pull's failure as its task's error ``(code, message)``."""
    if isinstance(exc, errors.LmspError):
        return exc.code, exc.message
    if isinstance(exc, OSError) and exc.errno in blobs.NO_SPACE:
        return "insufficient_storage", "The disk filled up during the pull; its bytes were deleted."
    if is_storage_error(exc):
        return "insufficient_storage", "The disk filled up during the pull; its bytes were deleted."
    if isinstance(exc, OSError):
        return "pull_failed", f"The pull could not write its file ({os.strerror(exc.errno or 0)})."
    log.exception("a pull failed", exc_info=exc)
    return "pull_failed", f"The pull failed: {type(exc).__name__}."
