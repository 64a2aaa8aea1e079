"""Retention (chapter 11.2): delete finished tasks, their events and stored responses
older than the retention period, expired idempotency keys and expired pairing requests,
and, only when an operator asks for it (``LMSP_CONVERSATION_RETENTION``; by default
retention never deletes a conversation, PROTOCOL.md 10), conversations unused that long
once none of their responses is stored, in small batches. Every delete condition names the
finished states, so no unfinished task can ever match; a response a later turn of its
conversation continues stays as long as that turn does. The same pass bounds the durable
prefix cache (:mod:`lmsp.engines.kvfiles`): entries of models no record names, entries
unused for its ttl, then the least recently used past its size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lmsp.engines.kvfiles import PrefixFiles
from lmsp.store import models, pairing, webhooks
from lmsp.store.db import Database
from lmsp.store.retention import (
    BATCH,
    delete_expired_keys_batch,
    delete_finished_batch,
    delete_unused_conversations_batch,
)
from lmsp.store.sql import Conn

__all__ = ["BATCH", "Swept", "delete_expired_keys_batch", "delete_finished_batch", "sweep"]


@dataclass
class Swept:
    responses: int = 0
    idempotency_keys: int = 0
    pairing_requests: int = 0
    kv_bytes: int = 0  # freed in the prefix cache
    webhook_deliveries: int = 0  # delivered or failed ones past the retention period
    conversations: int = 0  # unused for the retention period, with their items


def delete_expired_pairings_batch(conn: Conn, batch: int = BATCH) -> int:
    """Expired pairing requests (kept ``pairing.GRACE`` seconds so a late poll still
    hears ``expired_token``)."""
    return pairing.delete_expired_batch(conn, batch)


def sweep(
    db: Database,
    retention: float,
    now: float | None = None,
    kv: PrefixFiles | None = None,
    conversations: float | None = None,
) -> Swept:
    """One cleanup pass; each batch is its own short transaction. Ages are judged by
    the database's clock; ``now`` (this machine's by default) only ages the prefix cache's
    files, which are this machine's own. ``conversations``: how long an unused
    conversation is kept (``None``: for ever)."""
    stamp = time.time() if now is None else now
    swept = Swept()
    while n := db.write_sync(lambda c: delete_finished_batch(c, retention)):
        swept.responses += n
    if conversations is not None:
        age = conversations
        while n := db.write_sync(lambda c: delete_unused_conversations_batch(c, age)):
            swept.conversations += n
    while n := db.write_sync(delete_expired_keys_batch):
        swept.idempotency_keys += n
    while n := db.write_sync(delete_expired_pairings_batch):
        swept.pairing_requests += n
    while n := db.write_sync(lambda c: webhooks.delete_done_batch(c, retention, BATCH)):
        swept.webhook_deliveries += n
    if kv is not None:
        named = models.digests(db.reader())
        swept.kv_bytes = kv.keep_only(named) + kv.sweep(stamp)
    return swept
