"""Per-client limits (PROTOCOL.md 13): how many unfinished tasks a client may hold, how
many of them may run at once, and how many tokens it may use a minute and a day.

A limit is a column of the client's row (``NULL``: none). :func:`check` runs inside the
create's transaction, before anything is written: a request over a limit raises
``rate_limit_exceeded`` (``429`` with ``Retry-After``) and the transaction writes
nothing, neither the task nor the idempotency key. ``max_running`` is not checked here
but at claim time (:func:`lmsp.store.tasks.claim_next` passes over a client at its
limit). Token windows are the current UTC minute and the current UTC day, counted from
the usage ledger (:mod:`lmsp.store.usage`), which lives in the database: a restart does
not reset them. An embeddings request (no task) is held to the token limits only
(:func:`check_tokens`). The owner client is never limited (its limits cannot be set).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmsp.config import LIMIT_NAMES
from lmsp.errors import LmspError
from lmsp.ids import now as _now
from lmsp.protocol.states import UNFINISHED_SQL
from lmsp.store import usage
from lmsp.store.sql import Conn

NAMES = LIMIT_NAMES
#: the ``Retry-After`` of a client at its ``max_queued``: a hint (a task's end cannot
#: be foreseen), the time a short task takes
QUEUED_RETRY = 5


def of(conn: Conn, client_id: str) -> dict[str, int | None]:
    """A client's limits (``None``: no such limit); empty when there is no such client."""
    row = conn.execute(
        f"SELECT {', '.join(NAMES)} FROM clients WHERE id = ?", (client_id,)
    ).fetchone()
    if row is None:
        return {}
    return {name: None if row[name] is None else int(row[name]) for name in NAMES}


def update(conn: Conn, client_id: str, changes: Mapping[str, int | None]) -> dict[str, Any]:
    """Set (or, with ``None``, lift) some limits; returns ``{"before", "after"}``."""
    before = of(conn, client_id)
    wanted = {name: value for name, value in changes.items() if name in NAMES}
    if wanted:
        assignments = ", ".join(f"{name} = ?" for name in wanted)
        conn.execute(
            f"UPDATE clients SET {assignments} WHERE id = ?", (*wanted.values(), client_id)
        )
    return {"before": before, "after": of(conn, client_id)}


def _refuse(message: str, retry_after: int) -> LmspError:
    return LmspError(
        "rate_limit_exceeded", message, headers={"Retry-After": str(max(1, retry_after))}
    )


def check(conn: Conn, client_id: str) -> None:
    """Raise ``rate_limit_exceeded`` if one more task would put the client over a limit
    (the caller's transaction then writes nothing)."""
    limits = of(conn, client_id)
    if not any(value is not None for value in limits.values()):
        return
    stamp = _now()
    most = limits.get("max_queued")
    if most is not None:
        held = conn.execute(
            f"SELECT count(*) FROM tasks WHERE client_id = ? AND status IN ({UNFINISHED_SQL})",
            (client_id,),
        ).fetchone()[0]
        if int(held) >= most:
            raise _refuse(
                f"This client may hold {most} unfinished task(s) (max_queued) and holds"
                f" {held}; retry when one has finished.",
                QUEUED_RETRY,
            )
    _check_tokens(limits, conn, client_id, stamp)


def check_tokens(conn: Conn, client_id: str) -> None:
    """Raise ``rate_limit_exceeded`` if the client has used up its tokens of this minute
    or of this day (an embeddings request: no task to count)."""
    _check_tokens(of(conn, client_id), conn, client_id, _now())


def _check_tokens(limits: dict[str, int | None], conn: Conn, client_id: str, stamp: int) -> None:
    per_minute = limits.get("tokens_per_minute")
    if per_minute is not None:
        used = usage.tokens_in_minute(conn, client_id, stamp)
        if used >= per_minute:
            raise _refuse(
                f"This client used {used} of its {per_minute} tokens this minute"
                " (tokens_per_minute).",
                60 - stamp % 60,
            )
    per_day = limits.get("tokens_per_day")
    if per_day is not None:
        used = usage.tokens_on_day(conn, client_id, stamp)
        if used >= per_day:
            raise _refuse(
                f"This client used {used} of its {per_day} tokens today, UTC (tokens_per_day).",
                86400 - stamp % 86400,
            )
