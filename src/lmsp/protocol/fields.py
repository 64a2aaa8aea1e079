"""The refusal of a field an input item (or one of its parts) does not have: one
``400 unsupported_parameter`` naming the field's place, worded alike for every kind."""

from __future__ import annotations

from collections.abc import Container, Iterable

from lmsp.errors import LmspError


def only_fields(given: Iterable[str], allowed: Container[str], where: str, kind: str) -> None:
    """Refuse the first of ``given``'s field names not in ``allowed``; ``where``: the
    item's place (``input.3``), ``kind``: what it is (``message``, ``compaction item``)."""
    for name in given:
        if name not in allowed:
            raise LmspError(
                "unsupported_parameter",
                f"{where}.{name}: a {kind} has no field {name!r} here.",
                param=f"{where}.{name}",
            )
