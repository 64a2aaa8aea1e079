"""Retention's deletes (chapter 11.2), in small batches: every condition names the
finished states, so no unfinished task can ever match."""

from __future__ import annotations

from lmsp.protocol.states import FINISHED_SQL
from lmsp.store.sql import Conn

BATCH = 200


def delete_finished_batch(conn: Conn, cutoff: float, batch: int = BATCH) -> int:
    """Delete up to ``batch`` finished responses (their tasks and events cascade). A
    response a later stored turn continues is kept while that turn is (its history is
    stored by reference): a conversation expires from its last turn back."""
    cur = conn.execute(
        "DELETE FROM responses WHERE id IN ("
        f" SELECT t.response_id FROM tasks t WHERE t.status IN ({FINISHED_SQL})"
        "  AND t.finished_at IS NOT NULL AND t.finished_at < ?"
        "  AND NOT EXISTS (SELECT 1 FROM responses later WHERE later.previous_id = t.response_id)"
        "  ORDER BY t.finished_at LIMIT ?)",
        (int(cutoff), batch),
    )
    return cur.rowcount


def delete_expired_keys_batch(conn: Conn, now: float, batch: int = BATCH) -> int:
    cur = conn.execute(
        "DELETE FROM idempotency_keys WHERE (client_id, key) IN ("
        " SELECT client_id, key FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
        (int(now), batch),
    )
    return cur.rowcount
