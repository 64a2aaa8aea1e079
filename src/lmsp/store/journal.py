"""The MCP loop's journal is the task's event log (:mod:`lmsp.runner.mcp_loop`); this
reads the part of it a retry discards: the output events of the attempt before the last
``reset`` (a retried task re-emits its journaled calls from them, never sending them
again)."""

from __future__ import annotations

import json
from typing import Any

from lmsp.protocol import events as ev
from lmsp.store.sql import Conn

_OUTPUT_TYPES = ",".join(f"'{kind}'" for kind in sorted(ev.OUTPUT))


def previous_attempt(conn: Conn, task_id: str) -> list[dict[str, Any]]:
    """The output events logged between the last two ``reset`` requeues (or from the
    start to the only one); empty when the task was never reset."""
    resets = [
        int(seq)
        for seq, data in conn.execute(
            "SELECT sequence_number, data FROM task_events WHERE task_id = ? AND type = ?"
            " ORDER BY sequence_number",
            (task_id, ev.QUEUED),
        )
        if json.loads(data).get("reset")
    ]
    if not resets:
        return []
    start = resets[-2] if len(resets) > 1 else -1
    return [
        json.loads(row[0])
        for row in conn.execute(
            "SELECT data FROM task_events WHERE task_id = ? AND sequence_number > ?"
            f" AND sequence_number < ? AND type IN ({_OUTPUT_TYPES}) ORDER BY sequence_number",
            (task_id, start, resets[-1]),
        )
    ]
