"""Retention's deletes (chapter 11.2), in small batches: every condition names the
finished states, so no unfinished task can ever match.

Every age is judged by the database's clock (:func:`lmsp.store.sql.clock_sql`), never
the sweeping node's: on a database nodes share, a node whose clock runs days ahead
would otherwise find every other node's fresh work old enough to delete."""

from __future__ import annotations

from lmsp.protocol.states import FINISHED_SQL
from lmsp.store.sql import Conn, clock_sql

BATCH = 200


def delete_finished_batch(conn: Conn, age: float, batch: int = BATCH) -> int:
    """Delete up to ``batch`` responses finished more than ``age`` seconds ago (their
    tasks and events cascade). A response a later stored turn continues is kept while
    that turn is (its history is stored by reference): a conversation expires from its
    last turn back."""
    cur = conn.execute(
        "DELETE FROM responses WHERE id IN ("
        f" SELECT t.response_id FROM tasks t WHERE t.status IN ({FINISHED_SQL})"
        f"  AND t.finished_at IS NOT NULL AND t.finished_at < {clock_sql(conn)} - ?"
        "  AND NOT EXISTS (SELECT 1 FROM responses later WHERE later.previous_id = t.response_id)"
        "  ORDER BY t.finished_at LIMIT ?)",
        (float(age), batch),
    )
    return cur.rowcount


def delete_expired_keys_batch(conn: Conn, batch: int = BATCH) -> int:
    """Delete up to ``batch`` idempotency keys past their expiry (the database's clock)."""
    cur = conn.execute(
        "DELETE FROM idempotency_keys WHERE (client_id, key) IN ("
        f" SELECT client_id, key FROM idempotency_keys WHERE expires_at <= {clock_sql(conn)}"
        " LIMIT ?)",
        (batch,),
    )
    return cur.rowcount
