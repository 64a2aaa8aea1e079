"""Pure checks of what a client sends, shared by the routes: Unicode text that can be
stored and sent back, and sequence numbers (cursors, ``Last-Event-ID``) SQLite can hold.

Each refuses bad input with :class:`lmsp.errors.LmspError` (a ``400`` naming the
``param``) before anything is written.
"""

from __future__ import annotations

import re
from typing import Any

from lmsp import errors

MAX_SEQUENCE = 2**63 - 1  # SQLite's INTEGER
_EVENT_ID = re.compile(r"-?[0-9]{1,19}")


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """The path (``input.0.content``) of the first string in a parsed JSON value that
    holds a lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8 text can carry; else
    ``None``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")  # \\ud800
            inner = f"{where}.{shown}" if where else shown
            if (found := lone_surrogate(key, inner)) is not None:
                return found
            if (found := lone_surrogate(item, inner)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            inner = f"{where}.{index}" if where else str(index)
            if (found := lone_surrogate(item, inner)) is not None:
                return found
    return None


def refuse_lone_surrogates(value: Any) -> None:
    where = lone_surrogate(value)
    if where is not None:
        raise errors.invalid(
            f"{where}: the text holds a lone UTF-16 surrogate (such as \\ud800), which is"
            " not valid Unicode.",
            param=None if where == "body" else where,
            code="invalid_unicode",
        )


def event_id(text: str | None) -> int | None:
    """A ``Last-Event-ID`` header: ``None`` when absent or empty, else a sequence number
    from -1 to 2^63-1 in ASCII digits; anything else is a ``400``."""
    if text is None or not text.strip():
        return None
    raw = text.strip()
    if _EVENT_ID.fullmatch(raw) is None or not -1 <= int(raw) <= MAX_SEQUENCE:
        raise errors.invalid(
            "Last-Event-ID must be a sequence number this service sent (an integer from -1).",
            param="Last-Event-ID",
            code="invalid_value",
        )
    return int(raw)


def resume_after(after: int, last_event_id: str | None) -> int:
    """Where a stream resumes: after ``after`` or the ``Last-Event-ID``, whichever is
    later."""
    seen = event_id(last_event_id)
    return after if seen is None else max(after, seen)
