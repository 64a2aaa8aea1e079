"""Model aliases: another name for a model, so that a client with a fixed model name
(``gpt-4o-mini``, ``claude-sonnet-4-5``, ``text-embedding-3-small``, Codex CLI's default)
reaches a model of this server. Stored durably (migration ``m011_model_aliases`` /
``p011_model_aliases``); an alias whose model was deleted names nothing (``404``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmsp.ids import now
from lmsp.store import models
from lmsp.store.models import ModelRecord
from lmsp.store.sql import Conn, Row


@dataclass(frozen=True)
class Alias:
    alias: str
    model: str
    created_at: int


def resolve(conn: Conn, name: str) -> ModelRecord | None:
    """The model ``name`` names: a model id first, else an alias's model."""
    row = _row(conn, name)
    return None if row is None else models.of_row(row)


#: a model's row as stored, unparsed: equal rows, the same record
Stamp = tuple[Any, ...]


def resolve_stamped(conn: Conn, name: str) -> tuple[ModelRecord, Stamp] | None:
    """:func:`resolve`, with the row the record was read from (:func:`stamp`)."""
    row = _row(conn, name)
    return None if row is None else (models.of_row(row), _unparsed(row))


def stamp(conn: Conn, name: str) -> Stamp | None:
    """The row of the model ``name`` names now, unparsed (no JSON read): a record read
    as one stamp still holds while the stamp is the same — its id, digest, status,
    defaults and upstream, and for an alias the model it points at (``None``: it names
    nothing)."""
    row = _row(conn, name)
    return None if row is None else _unparsed(row)


def _unparsed(row: Row) -> Stamp:
    return tuple(row[i] for i in range(len(row)))


def _row(conn: Conn, name: str) -> Row | None:
    found: Row | None = conn.execute("SELECT * FROM models WHERE id = ?", (name,)).fetchone()
    if found is not None:
        return found
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT m.* FROM model_aliases a JOIN models m ON m.id = a.model WHERE a.alias = ?",
        (name,),
    ).fetchone()


def all_aliases(conn: Conn) -> list[Alias]:
    rows = conn.execute("SELECT alias, model, created_at FROM model_aliases ORDER BY alias")
    return [Alias(r["alias"], r["model"], int(r["created_at"])) for r in rows]


def put(conn: Conn, alias: str, model: str) -> str:
    """Point ``alias`` at ``model``: ``set``, ``missing`` (no such model) or ``taken``
    (a model has that id: a model's own name always wins)."""
    if models.get(conn, model) is None:
        return "missing"
    if models.get(conn, alias) is not None:
        return "taken"
    conn.execute(
        "INSERT INTO model_aliases (alias, model, created_at) VALUES (?, ?, ?)"
        " ON CONFLICT (alias) DO UPDATE SET model = excluded.model",
        (alias, model, now()),
    )
    return "set"


def delete(conn: Conn, alias: str) -> bool:
    return conn.execute("DELETE FROM model_aliases WHERE alias = ?", (alias,)).rowcount > 0
