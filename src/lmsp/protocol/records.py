"""A task's and a response's stored row, typed (pure): what the store's readers return.

Each record has every column of its table as a field, with its Python type: a status is
a :class:`~lmsp.protocol.states.Status`, a flag stored as an integer a ``bool``, a
column stored as JSON text its value (the request a
:class:`~lmsp.protocol.request.PreparedRequest`, read by
:func:`lmsp.protocol.request.loads` whatever version stored it). Text becomes a value in
one place, :func:`typed` (and :meth:`ResponseRecord.of`, whose request is read by its
version), which takes a row of either database (``sqlite3.Row``, the PostgreSQL row of
:mod:`lmsp.store.pg`); the store's other typed rows (a model, a pull, a client) are read
by it too, and nothing above the store reads a row by its column names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

import msgspec

from lmsp.protocol import request as stored
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.states import Policy, Status


class Row(Protocol):
    """A whole row of its table: its column names and its values, in the same order
    (``sqlite3.Row``, the PostgreSQL row)."""

    def keys(self) -> list[str]: ...

    def __iter__(self) -> Iterator[Any]: ...


T = TypeVar("T")


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def typed(kind: type[T], row: Row, *json_columns: str) -> T:
    """``row`` as ``kind`` (a struct or dataclass with a field named as each column it
    keeps; a column it has no field for is left out): the ``json_columns`` decoded from
    their text, every value checked against its field's type."""
    fields = dict(zip(row.keys(), row, strict=True))
    for name in json_columns:
        fields[name] = _json(fields[name])
    return msgspec.convert(fields, kind)


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``tasks``."""

    #: its place in the queue (the list's cursor; FIFO within a client and tier)
    seq: int
    id: str
    response_id: str
    client_id: str
    status: Status
    on_restart: Policy
    attempt: int
    last_sequence_number: int
    created_at: int
    updated_at: int
    finished_at: int | None
    error_code: str | None
    error_message: str | None
    #: what a resume continues from (:mod:`lmsp.store.snapshots`); ``None``: nothing
    snapshot: dict[str, Any] | None
    #: the node that claimed it, and the lease epoch it claimed it under
    node_id: str | None
    lease_epoch: int
    #: its service tier in the claim order (0 flex, 1 default, 2 priority)
    tier: int

    @classmethod
    def of(cls, row: Row) -> TaskRecord:
        return typed(cls, row, "snapshot")

    @property
    def error(self) -> dict[str, str] | None:
        """``{"code", "message"}`` of a failed task, else ``None``."""
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message or ""}


class ResponseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``responses``."""

    id: str
    client_id: str
    #: the model it runs on, by id, and the blob that ran it (once it started)
    model: str
    model_digest: str | None
    created_at: int
    #: as created, its history by reference (:mod:`lmsp.store.responses` expands it)
    request: PreparedRequest
    background: bool
    store: bool
    #: what its task consumed (:func:`lmsp.protocol.objects.usage_counts`), once finished
    usage: dict[str, int] | None
    incomplete_reason: str | None
    #: its output items, stored once its task finished (``None`` before)
    output: list[dict[str, Any]] | None
    #: the response it continues (``previous_response_id``), while that one is stored
    previous_id: str | None
    conversation_id: str | None

    @classmethod
    def of(cls, row: Row) -> ResponseRecord:
        fields = dict(zip(row.keys(), row, strict=True))
        fields["request"] = stored.loads(fields["request"])
        fields["background"] = bool(fields["background"])
        fields["store"] = bool(fields["store"])
        fields["usage"] = _json(fields["usage"])
        fields["output"] = _json(fields["output"])
        return msgspec.convert(fields, cls)
