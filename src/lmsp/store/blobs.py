"""The blob store: model files under ``blobs/sha256-<hex>``, never in the database.

A file enters by being copied while it is hashed, into a temporary file renamed into
place only once complete and synced: a failed copy (no space left, a read error, a
crash) leaves no partial blob under a digest name. Import, verify and delete are the
workflows the API and the CLI share; the database holds only the records.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from lmsp import errors
from lmsp.gguf import NotGGUF, model_metadata
from lmsp.store import models
from lmsp.store.db import Database
from lmsp.store.models import ModelRecord

CHUNK = 1 << 20
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


def store_blob(
    blobs_dir: Path, source: Path | bytes, progress: Progress | None = None
) -> tuple[str, int]:
    """Copy a file (or bytes) into the blob store while hashing it; ``(digest, size)``.

    ``progress`` is called with the byte count of every chunk copied.
    """
    blobs_dir.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(dir=blobs_dir, prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as out:
            if isinstance(source, bytes):
                sha.update(source)
                write_chunk(out, source)
                size = len(source)
            else:
                with source.open("rb") as src:
                    while chunk := src.read(CHUNK):
                        sha.update(chunk)
                        write_chunk(out, chunk)
                        size += len(chunk)
                        if progress is not None:
                            progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
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


def import_model(
    db: Database,
    blobs_dir: Path,
    model_id: str,
    path: Path,
    expected_digest: str | None = None,
    progress: Progress | None = None,
) -> ModelRecord:
    """``POST /v1/models``: copy a local GGUF file into the blob store while hashing it,
    then write its record. Errors are :class:`lmsp.errors.LmspError` with the protocol's
    statuses (400, 409, 507)."""
    if models.get(db.reader(), model_id) is not None:
        raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    source = path.expanduser()
    if not source.is_file():
        raise errors.invalid(f"No file at {str(path)!r}.", "path", code="model_file_not_found")
    try:
        meta = model_metadata(source)
    except NotGGUF as exc:
        raise errors.invalid(f"Not a GGUF model file: {exc}", "path", "invalid_model_file") from exc
    except OSError as exc:
        raise errors.invalid(
            f"The file cannot be read: {exc.strerror}.", "path", "model_file_not_found"
        ) from exc
    blobs_dir.mkdir(parents=True, exist_ok=True)
    size = source.stat().st_size
    if shutil.disk_usage(blobs_dir).free < size:
        raise _no_space(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    meta["source_file"] = source.name
    with _blob_lock:
        try:
            digest, size = store_blob(blobs_dir, source, progress)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise _no_space(exc) from exc
            raise
        if expected_digest is not None and expected_digest != digest:
            _remove_unreferenced(db, blobs_dir, digest)
            raise errors.invalid(
                f"The file hashes to {digest}, not {expected_digest}: it changed while read.",
                "digest",
                code="digest_mismatch",
            )

        def job(conn: sqlite3.Connection) -> bool:
            if models.get(conn, model_id) is not None:
                return False
            models.add(
                conn,
                model_id=model_id,
                engine="llama_cpp",
                digest=digest,
                size_bytes=size,
                fmt="gguf",
                owned_by="user",
                metadata=meta,
            )
            models.set_status(conn, model_id, "ready", verified=True)  # hashed just now
            return True

        if not db.write_sync(job):
            _remove_unreferenced(db, blobs_dir, digest)
            raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    record = models.get(db.reader(), model_id)
    assert record is not None
    return record


def _remove_unreferenced(db: Database, blobs_dir: Path, digest: str) -> bool:
    if models.referenced(db.reader(), digest):
        return False
    blob_path(blobs_dir, digest).unlink(missing_ok=True)
    return True


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
    return record


def leftovers(blobs_dir: Path) -> list[Path]:
    """Temporary files of copies that never finished (a crash mid-import)."""
    return sorted(blobs_dir.glob(".partial-*")) if blobs_dir.is_dir() else []
