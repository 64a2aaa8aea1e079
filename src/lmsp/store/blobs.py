"""The blob store: model files under ``blobs/sha256-<hex>``, never in the database.

A file enters by being copied while it is hashed, into a temporary file renamed into
place only once complete and synced: a failed copy (no space left, a read error, a
crash) leaves no partial blob under a digest name. Import, verify and delete are the
workflows the API and the CLI share; the database holds only the records.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

from lmsp import errors
from lmsp.datadir import ensure_private_dir
from lmsp.gguf import NotGGUF, check_structure, metadata_of, read_header_from
from lmsp.store import models
from lmsp.store.db import Database
from lmsp.store.models import ModelRecord
from lmsp.store.sql import Conn

CHUNK = 1 << 20
#: the largest tokenizer.json a remote model may name (the largest known are ~20 MiB)
TOKENIZER_JSON_MAX = 256 << 20
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
Progress = Callable[[int], None]

# imports and deletes of blobs are serialised in this process, so a delete never removes
# a blob that an import is about to register again under another id
_blob_lock = threading.Lock()


def blob_path(blobs_dir: Path, digest: str) -> Path:
    algo, hexdigest = digest.split(":", 1)
    return blobs_dir / f"{algo}-{hexdigest}"


def write_chunk(out: BinaryIO, chunk: bytes) -> None:
    """Write one chunk of a copy (tests replace this to simulate a full disk)."""
    out.write(chunk)


#: bytes between two hand-overs of a file's new bytes to the disk (a pull's part file,
#: a blob being copied in; see :func:`start_writeback`)
WRITEBACK = 8 << 20


def _writeback_call() -> Callable[[int, int, int, int], int] | None:
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], call)


_SYNC_FILE_RANGE = _writeback_call()


def start_writeback(fd: int, start: int, end: int) -> None:
    """Start writing bytes ``start`` to ``end`` of ``fd`` to the disk, without waiting
    (Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``): a later ``fsync`` (a pull's
    before each progress event, the last one of a copy) then finds little left to
    write, where one at the end alone took ~50 ms for a 94 MiB file. A no-op elsewhere;
    the ``fsync`` calls stay what makes bytes durable."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, start, end - start, 2)  # SYNC_FILE_RANGE_WRITE


def store_blob(
    blobs_dir: Path,
    source: Path | bytes | BinaryIO,
    progress: Progress | None = None,
    *,
    limit: int | None = None,
    check: Callable[[BinaryIO, int], None] | None = None,
) -> tuple[str, int]:
    """Copy a file (a path, an open file or bytes) into the blob store while hashing
    it; ``(digest, size)``.

    At most ``limit`` bytes are copied from an open file (its size when it was
    checked: a file growing meanwhile, or a device, cannot fill the disk). ``check``
    runs on the private copy, synced and reopened for reading, before it is renamed to
    its digest name: what it raises leaves no blob. ``progress`` is called with the
    byte count of every chunk copied.
    """
    ensure_private_dir(blobs_dir)
    sha = hashlib.sha256()
    size = written = 0  # written: the bytes handed to the disk so far
    fd, tmp_name = tempfile.mkstemp(dir=blobs_dir, prefix=".partial-")
    try:
        with os.fdopen(fd, "w+b") as out:
            if isinstance(source, bytes):
                sha.update(source)
                write_chunk(out, source)
                size = len(source)
            else:
                with contextlib.ExitStack() as stack:
                    src = (
                        source
                        if not isinstance(source, Path)
                        else stack.enter_context(source.open("rb"))
                    )
                    while limit is None or size < limit:
                        want = CHUNK if limit is None else min(CHUNK, limit - size)
                        chunk = src.read(want)
                        if not chunk:
                            break
                        sha.update(chunk)
                        write_chunk(out, chunk)
                        size += len(chunk)
                        if size - written >= WRITEBACK:
                            start_writeback(out.fileno(), written, size)
                            written = size
                        if progress is not None:
                            progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
            if check is not None:
                check(out, size)
        digest = f"sha256:{sha.hexdigest()}"
        final = blob_path(blobs_dir, digest)
        if final.exists() and final.stat().st_size == size:
            os.unlink(tmp_name)
        else:
            os.replace(tmp_name, final)
        return digest, size
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


def hash_file(path: Path, progress: Progress | None = None) -> tuple[str, int]:
    """``(digest, size)`` of a file, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
            if progress is not None:
                progress(len(chunk))
    return f"sha256:{sha.hexdigest()}", size


def check_size(blobs_dir: Path, record: ModelRecord) -> str | None:
    """The cheap check done before every load: the blob exists with the recorded size.
    Returns what is wrong, or ``None``."""
    try:
        size = blob_path(blobs_dir, record.digest).stat().st_size
    except FileNotFoundError:
        return f"The blob of {record.id!r} is missing."
    if size != record.size_bytes:
        return f"The blob of {record.id!r} has {size} bytes, {record.size_bytes} expected."
    return None


def check_digest(blobs_dir: Path, record: ModelRecord) -> str | None:
    """The full check: size, then the SHA-256 of every byte. What is wrong, or ``None``."""
    problem = check_size(blobs_dir, record)
    if problem is not None:
        return problem
    digest, _ = hash_file(blob_path(blobs_dir, record.digest))
    if digest != record.digest:
        return f"The blob of {record.id!r} hashes to {digest}, not {record.digest}."
    return None


def verify(db: Database, blobs_dir: Path, model_id: str) -> tuple[ModelRecord, str | None]:
    """Recompute a model's digest and record the outcome (``ready`` or ``corrupt``, with
    ``verified_at``). Returns the updated record and the problem found, if any."""
    record = models.get(db.reader(), model_id)
    if record is None:
        raise errors.not_found("model", model_id)
    problem = check_digest(blobs_dir, record)
    status = "ready" if problem is None else "corrupt"
    db.write_sync(lambda c: models.set_status(c, model_id, status, verified=True))
    updated = models.get(db.reader(), model_id)
    assert updated is not None
    return updated, problem


def _no_space(exc: OSError) -> errors.LmspError:
    return errors.LmspError(
        "insufficient_storage", f"Not enough disk space for the model: {exc.strerror}."
    )


UNREADABLE = (
    "The path does not name a readable regular file on the service's machine "
    "(it is missing, not readable by the service, or not a regular file)."
)


def _unreadable() -> errors.LmspError:
    return errors.invalid(UNREADABLE, "path", code="model_file_not_found")


def _not_gguf(exc: NotGGUF) -> errors.LmspError:
    return errors.invalid(f"Not a whole GGUF model file: {exc}", "path", "invalid_model_file")


def open_source(path: Path) -> tuple[BinaryIO, int]:
    """Open a file to import, once: ``(file, size)`` of a regular file, else the one
    answer :data:`UNREADABLE`, whatever the reason (no file, no permission, a directory,
    a device, a FIFO, a name too long), so the answer tells nothing about the server's
    disk. What is then checked and copied is this open file: swapping the path (a
    symlink to ``/dev/zero``) after the open changes nothing."""
    try:
        path = path.expanduser()  # RuntimeError: ``~someone`` with no such user
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError, RuntimeError):  # ValueError: a NUL byte in the path
        raise _unreadable() from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _unreadable()
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0), info.st_size
    except BaseException:
        os.close(fd)
        raise


def tokenizer_json_meta(source: BinaryIO) -> dict[str, Any]:
    """The ``models.metadata`` of a Hugging Face ``tokenizer.json`` (a remote model's
    tokenizer): a JSON object with a ``model``, else ``400 invalid_model_file``."""
    try:
        data = json.loads(source.read(TOKENIZER_JSON_MAX))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise errors.invalid(
            "Not a GGUF file nor a tokenizer.json (a JSON object with a model).",
            "path",
            "invalid_model_file",
        )
    return {"architecture": None, "tokenizer": str(data["model"].get("type") or "")}


def _whole_gguf(expected: int, tokenizer_json: bool = False) -> Callable[[BinaryIO, int], None]:
    """The check of a private copy: as long as the file was, and a whole GGUF (or, for
    a remote model's tokenizer, a ``tokenizer.json``: :func:`tokenizer_json_meta`)."""

    def check(copy: BinaryIO, copied: int) -> None:
        if copied != expected:
            raise errors.invalid(
                "The file got shorter while it was read; nothing was imported.",
                "path",
                code="invalid_model_file",
            )
        if tokenizer_json:
            copy.seek(0)
            tokenizer_json_meta(copy)
            return
        try:
            check_structure(copy, copied)
        except NotGGUF as exc:
            raise _not_gguf(exc) from exc

    return check


def import_model(
    db: Database,
    blobs_dir: Path,
    model_id: str,
    path: Path,
    expected_digest: str | None = None,
    progress: Progress | None = None,
    defaults: dict[str, float | int] | None = None,
    remote: dict[str, Any] | None = None,
) -> ModelRecord:
    """``POST /v1/models``: copy a local GGUF file into the blob store while hashing it,
    then write its record (with ``remote``: a remote model, the file its tokenizer).
    Errors are :class:`lmsp.errors.LmspError` with the protocol's statuses (400, 409,
    507); no message names a path.

    The file is opened once (:func:`open_source`); its header and size are read from
    that descriptor, at most that many bytes are copied, and the private copy's whole
    GGUF structure is checked before it becomes a blob, so a file changed or truncated
    meanwhile never imports as ``ready``."""
    if models.get(db.reader(), model_id) is not None:
        raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    source, size = open_source(path)
    with source:
        # a remote model's tokenizer may be a tokenizer.json: anything not a GGUF is one
        tokenizer_json = remote is not None and source.read(4) != b"GGUF"
        source.seek(0)
        if tokenizer_json and size > TOKENIZER_JSON_MAX:
            raise errors.invalid("A tokenizer.json of over 256 MiB.", "path", "invalid_model_file")
        try:
            meta = (
                tokenizer_json_meta(source)
                if tokenizer_json
                else metadata_of(read_header_from(source))
            )
        except NotGGUF as exc:
            raise _not_gguf(exc) from exc
        source.seek(0)
        ensure_private_dir(blobs_dir)
        if shutil.disk_usage(blobs_dir).free < size:
            raise _no_space(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        meta["source_file"] = path.name
        with _blob_lock:
            try:
                digest, _ = store_blob(
                    blobs_dir,
                    source,
                    progress,
                    limit=size,
                    check=_whole_gguf(size, tokenizer_json),
                )
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    raise _no_space(exc) from exc
                raise _unreadable() from None
            if expected_digest is not None and expected_digest != digest:
                _remove_unreferenced(db, blobs_dir, digest)
                raise errors.invalid(
                    f"The file hashes to {digest}, not {expected_digest}: it changed while read.",
                    "digest",
                    code="digest_mismatch",
                )

            def job(conn: Conn) -> bool:
                if models.get(conn, model_id) is not None:
                    return False
                fmt = "tokenizer.json" if tokenizer_json else "gguf"
                models.add_hashed_gguf(conn, model_id, digest, size, meta, defaults, remote, fmt)
                return True

            try:
                added = db.write_sync(job)
            except BaseException:
                _remove_unreferenced(db, blobs_dir, digest)  # e.g. the disk is full
                raise
            if not added:
                _remove_unreferenced(db, blobs_dir, digest)
                raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    record = models.get(db.reader(), model_id)
    assert record is not None
    return record


def _remove_unreferenced(db: Database, blobs_dir: Path, digest: str) -> bool:
    conn = db.reader()
    if models.referenced(conn, digest) or digest in part_digests(conn):
        return False
    blob_path(blobs_dir, digest).unlink(missing_ok=True)
    return True


def part_digests(conn: Conn) -> set[str]:
    """The blobs of every part of the split models (a pulled ``-0000k-of-0000n.gguf``):
    the record's own digest names the first part, its metadata all of them."""
    found: set[str] = set()
    for (metadata,) in conn.execute("SELECT metadata FROM models WHERE metadata LIKE '%parts%'"):
        for part in json.loads(metadata).get("parts") or []:
            found.add(str(part["digest"]))
    return found


def model_path(blobs_dir: Path, record: ModelRecord) -> Path:
    """The file an engine loads for ``record``: its blob; for a split model, the first
    part under its own name in ``split-<hex>/``, where links give every part the name
    llama.cpp looks for (``…-00002-of-00003.gguf`` beside ``…-00001-of-00003.gguf``)."""
    parts = record.metadata.get("parts") or []
    if len(parts) < 2:
        return blob_path(blobs_dir, record.digest)
    folder = blobs_dir / f"split-{record.hex}"
    folder.mkdir(mode=0o700, exist_ok=True)
    for part in parts:
        link = folder / str(part["file"])
        if not link.is_symlink():
            link.symlink_to(Path("..") / blob_path(blobs_dir, str(part["digest"])).name)
    return folder / str(parts[0]["file"])


def delete_model(db: Database, blobs_dir: Path, model_id: str) -> ModelRecord:
    """``DELETE /v1/models/{id}``: remove the record (``409 model_in_use`` while unfinished
    tasks use it), then its blob if no other record names it."""
    with _blob_lock:
        record = models.get(db.reader(), model_id)
        outcome = db.write_sync(lambda c: models.delete(c, model_id))
        if outcome == "missing" or record is None:
            raise errors.not_found("model", model_id)
        if outcome == "in_use":
            raise errors.LmspError("model_in_use", f"Unfinished tasks use the model {model_id!r}.")
        _remove_unreferenced(db, blobs_dir, record.digest)
        for part in record.metadata.get("parts") or []:  # a split model's other parts
            _remove_unreferenced(db, blobs_dir, str(part["digest"]))
        shutil.rmtree(blobs_dir / f"split-{record.hex}", ignore_errors=True)
    return record


def leftovers(blobs_dir: Path) -> list[Path]:
    """Temporary files of copies that never finished (a crash mid-import)."""
    return sorted(blobs_dir.glob(".partial-*")) if blobs_dir.is_dir() else []


def orphans(conn: Conn, blobs_dir: Path) -> list[Path]:
    """Blobs no model record names: a crash between renaming a copy into place and
    committing its record leaves one."""
    if not blobs_dir.is_dir():
        return []
    named = {str(r[0]) for r in conn.execute("SELECT DISTINCT digest FROM models")}
    named |= part_digests(conn)
    found = []
    for path in sorted(blobs_dir.glob("sha256-*")):
        if f"sha256:{path.name.removeprefix('sha256-')}" not in named:
            found.append(path)
    return found


def remove_orphans(db: Database, blobs_dir: Path) -> list[Path]:
    """Delete the blobs and copies no record names (at startup and by ``lmsp gc``, with
    the data directory locked, so no import of another process is between its rename
    and its commit; imports of this process are held off by the blob lock)."""
    with _blob_lock:
        gone = leftovers(blobs_dir) + orphans(db.reader(), blobs_dir)
        for path in gone:
            path.unlink(missing_ok=True)
    return gone


#: held while pulled files become blobs and their model is registered (a pull's files
#: are blobs no record names until that commit: nothing may remove them meanwhile)
blob_lock = _blob_lock


def remove_unreferenced(db: Database, blobs_dir: Path, digest: str) -> bool:
    """Delete a blob no model record names (a pull that did not register its files)."""
    return _remove_unreferenced(db, blobs_dir, digest)
