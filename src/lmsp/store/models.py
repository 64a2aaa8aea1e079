"""Model records: metadata and content digests. The files live in the blob store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lmsp.ids import now as _now
from lmsp.protocol.records import typed
from lmsp.protocol.states import UNFINISHED_SQL
from lmsp.store.sql import Conn, Row


@dataclass(frozen=True)
class ModelRecord:
    id: str
    format: str
    engine: str
    digest: str
    size_bytes: int
    owned_by: str
    created_at: int
    metadata: dict[str, Any]
    status: str = "ready"
    verified_at: int | None = None
    #: sampling defaults (``temperature``, ``top_p``, ``top_k``, ``min_p``,
    #: ``presence_penalty``, ``frequency_penalty``, ``repeat_penalty``)
    defaults: dict[str, float | int] = field(default_factory=dict)
    #: a model served by a remote upstream (engine ``remote``): ``url``,
    #: ``upstream_model``, ``api_key_env``, ``inflight``, ``capabilities`` (what the
    #: upstream was found able to do when the model was added); ``None``: lmsp runs it
    remote: dict[str, Any] | None = None

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]


def of_row(row: Row) -> ModelRecord:
    """The record of a ``models`` row (``SELECT *``)."""
    return typed(ModelRecord, row, "metadata", "defaults", "remote")


def capabilities(record: ModelRecord) -> tuple[str, ...]:
    """What a model can take and do: text completion (no engine here has vision)."""
    return ("completion",)


def set_remote(conn: Conn, model_id: str, remote: dict[str, Any]) -> None:
    """Name the upstream that serves ``model_id`` and what it was found able to do."""
    conn.execute("UPDATE models SET remote = ? WHERE id = ?", (json.dumps(remote), model_id))


def all_models(conn: Conn) -> list[ModelRecord]:
    return [of_row(r) for r in conn.execute("SELECT * FROM models ORDER BY position, id")]


def get(conn: Conn, model_id: str) -> ModelRecord | None:
    row = conn.execute("SELECT * FROM models WHERE id = ?", (model_id,)).fetchone()
    return None if row is None else of_row(row)


def add(conn: Conn, record: ModelRecord) -> None:
    """Write ``record`` as a new model, listed after every other."""
    position = conn.execute("SELECT coalesce(max(position), -1) + 1 FROM models").fetchone()[0]
    remote = None if record.remote is None else json.dumps(record.remote)
    conn.execute(
        "INSERT INTO models (id, format, engine, digest, size_bytes, owned_by, metadata,"
        " position, created_at, defaults, status, verified_at, remote)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.format,
            record.engine,
            record.digest,
            record.size_bytes,
            record.owned_by,
            json.dumps(record.metadata),
            position,
            record.created_at,
            json.dumps(record.defaults),
            record.status,
            record.verified_at,
            remote,
        ),
    )


def add_hashed_gguf(
    conn: Conn,
    model_id: str,
    digest: str,
    size_bytes: int,
    metadata: dict[str, Any],
    defaults: dict[str, float | int] | None = None,
    remote: dict[str, Any] | None = None,
    fmt: str = "gguf",
) -> None:
    """A user's GGUF file, hashed as it was written to the blob store (imported or
    pulled), as a ``ready`` model verified now; with ``remote``, a remote model whose
    tokenizer the file is (a GGUF, or ``fmt`` ``tokenizer.json``)."""
    now = _now()
    add(
        conn,
        ModelRecord(
            id=model_id,
            format=fmt,
            engine="llama_cpp" if remote is None else "remote",
            digest=digest,
            size_bytes=size_bytes,
            owned_by="user",
            created_at=now,
            metadata=metadata,
            verified_at=now,
            defaults=defaults or {},
            remote=remote,
        ),
    )


def add_once(conn: Conn, record: ModelRecord) -> None:
    """Register a model unless one with this id exists (first-start registration)."""
    if get(conn, record.id) is None:
        add(conn, record)


def set_defaults(
    conn: Conn, model_id: str, changes: dict[str, float | int | None]
) -> ModelRecord | None:
    """Change a model's sampling defaults (a ``None`` value removes one); the record, or
    ``None`` if there is no such model. Tasks already created keep their numbers."""
    record = get(conn, model_id)
    if record is None:
        return None
    merged = dict(record.defaults)
    for name, value in changes.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    conn.execute("UPDATE models SET defaults = ? WHERE id = ?", (json.dumps(merged), model_id))
    return get(conn, model_id)


def set_status(conn: Conn, model_id: str, status: str, verified: bool = False) -> None:
    """Mark a model ``ready`` or ``corrupt``; ``verified`` stamps a full digest check."""
    if verified:
        conn.execute(
            "UPDATE models SET status = ?, verified_at = ? WHERE id = ?",
            (status, _now(), model_id),
        )
    else:
        conn.execute("UPDATE models SET status = ? WHERE id = ?", (status, model_id))


def mark_corrupt_digest(conn: Conn, digest: str) -> None:
    """Every model whose record names this blob is corrupt (they share the bad file)."""
    conn.execute("UPDATE models SET status = 'corrupt' WHERE digest = ?", (digest,))


def users(conn: Conn, model_id: str) -> int:
    """How many unfinished tasks run (or wait to run) this model."""
    row = conn.execute(
        "SELECT count(*) FROM tasks JOIN responses ON responses.id = tasks.response_id"
        f" WHERE responses.model = ? AND tasks.status IN ({UNFINISHED_SQL})",
        (model_id,),
    ).fetchone()
    return int(row[0])


def awaited(conn: Conn) -> list[ModelRecord]:
    """The ready models unfinished tasks will run, those of running tasks first: what a
    restart may load before any task asks for it."""
    rows = conn.execute(
        "SELECT responses.model, max(CASE WHEN tasks.status = 'queued' THEN 0 ELSE 1 END)"
        " AS started FROM tasks JOIN responses ON responses.id = tasks.response_id"
        f" WHERE tasks.status IN ({UNFINISHED_SQL}) GROUP BY responses.model"
        " ORDER BY started DESC, responses.model"
    ).fetchall()
    found = (get(conn, row[0]) for row in rows)
    return [record for record in found if record is not None and record.status == "ready"]


def delete(conn: Conn, model_id: str) -> str:
    """Delete a model record: ``deleted``, ``missing`` or ``in_use`` (unfinished tasks
    use it; nothing changes then). The caller removes the blob once unreferenced."""
    if get(conn, model_id) is None:
        return "missing"
    if users(conn, model_id):
        return "in_use"
    conn.execute("DELETE FROM models WHERE id = ?", (model_id,))
    return "deleted"


def referenced(conn: Conn, digest: str) -> bool:
    return conn.execute("SELECT 1 FROM models WHERE digest = ?", (digest,)).fetchone() is not None


def digests(conn: Conn) -> set[str]:
    """The digests some model record names (blobs and saved prefixes of others go)."""
    return {str(r[0]) for r in conn.execute("SELECT DISTINCT digest FROM models")}
