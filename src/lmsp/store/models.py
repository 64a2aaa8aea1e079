"""Model records: metadata and content digests. The files live in the blob store."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from lmsp.ids import now as _now


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

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]


def _record(row: sqlite3.Row) -> ModelRecord:
    return ModelRecord(
        id=row["id"],
        format=row["format"],
        engine=row["engine"],
        digest=row["digest"],
        size_bytes=int(row["size_bytes"]),
        owned_by=row["owned_by"],
        created_at=int(row["created_at"]),
        metadata=json.loads(row["metadata"]),
    )


def all_models(conn: sqlite3.Connection) -> list[ModelRecord]:
    return [_record(r) for r in conn.execute("SELECT * FROM models ORDER BY position, id")]


def get(conn: sqlite3.Connection, model_id: str) -> ModelRecord | None:
    row = conn.execute("SELECT * FROM models WHERE id = ?", (model_id,)).fetchone()
    return None if row is None else _record(row)


def add(
    conn: sqlite3.Connection,
    *,
    model_id: str,
    engine: str,
    digest: str,
    size_bytes: int,
    fmt: str,
    owned_by: str,
    metadata: dict[str, Any],
) -> None:
    position = conn.execute("SELECT coalesce(max(position), -1) + 1 FROM models").fetchone()[0]
    conn.execute(
        "INSERT INTO models (id, format, engine, digest, size_bytes, owned_by, metadata,"
        " position, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            model_id,
            fmt,
            engine,
            digest,
            size_bytes,
            owned_by,
            json.dumps(metadata),
            position,
            _now(),
        ),
    )


def add_once(conn: sqlite3.Connection, *, model_id: str, **fields: Any) -> None:
    """Register a model unless one with this id exists (first-start registration)."""
    if get(conn, model_id) is None:
        add(conn, model_id=model_id, **fields)
