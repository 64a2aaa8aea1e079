"""Retention's deletes (chapter 11.2), in small batches: every condition names the
finished states, so no unfinished task can ever match.

Every age is judged by the database's clock (:func:`lmsp.store.sql.clock_sql`), never
the sweeping node's: on a database nodes share, a node whose clock runs days ahead
would otherwise find every other node's fresh work old enough to delete.

A conversation is swept once unused (``updated_at``: no item added or deleted, no turn
started, its metadata unchanged) for the retention period and no response of it is
stored any more (its turns are swept first, by the same rule as every response)."""

from __future__ import annotations

from lmsp.protocol.states import FINISHED_SQL
from lmsp.store.sql import Conn, clock_sql

BATCH = 200
#: the most items one batch of swept conversations deletes (a larger one goes alone)
ITEMS_BATCH = 2000


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


def delete_unused_conversations_batch(
    conn: Conn, age: float, batch: int = BATCH, items: int = ITEMS_BATCH
) -> int:
    """Delete up to ``batch`` conversations (holding ``items`` items in all, or a
    single larger one) unused for more than ``age`` seconds, none of whose responses is
    stored, with their items. Their rows are locked first on PostgreSQL, so a turn that
    starts meanwhile on another node either comes first (and keeps the conversation) or
    finds it gone (``404``)."""
    rows = conn.execute(
        "SELECT c.id, c.item_count FROM conversations c"
        f" WHERE c.updated_at < {clock_sql(conn)} - ?"
        "  AND NOT EXISTS (SELECT 1 FROM responses r WHERE r.conversation_id = c.id)"
        f" ORDER BY c.updated_at LIMIT ?{conn.for_update}",
        (float(age), batch),
    ).fetchall()
    chosen: list[str] = []
    held = 0
    for row in rows:
        if chosen and held + int(row["item_count"]) > items:
            break
        chosen.append(row["id"])
        held += int(row["item_count"])
    if not chosen:
        return 0
    marks = ", ".join("?" for _ in chosen)
    conn.execute(f"DELETE FROM conversation_items WHERE conversation_id IN ({marks})", chosen)
    cur = conn.execute(f"DELETE FROM conversations WHERE id IN ({marks})", chosen)
    return cur.rowcount
