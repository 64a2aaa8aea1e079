"""What the service is doing now (``admin``, for ``lmsp ps`` and the console): loaded
models with their memory, their engine processes (pid, restarts, a crash loop's
failure), the sequences being generated with their speed (and a prompt being read, how
far and how fast), the tasks waiting and why, the queue, the clients with unfinished
work, the nodes sharing the database and the models being pulled. Counts, ids and names
only: no prompt or output text."""

from __future__ import annotations

import time
from typing import Any

from lmsp.app.core import Core
from lmsp.config import Settings
from lmsp.metrics import Sequence, holdups
from lmsp.store import nodes, pulls
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn, Row

#: the waiting tasks listed (the queue's count covers them all)
WAITING_SHOWN = 20


async def activity(core: Core) -> dict[str, Any]:
    """The ``service.activity`` object."""
    return await core.read(_activity, core)


def _activity(core: Core) -> dict[str, Any]:
    conn = core.db.reader()
    now = time.monotonic()
    live = core.metrics.sequences()
    busy = core.runner.busy
    queued = task_store.queue_summary(conn)
    settings = core.settings
    return {
        "object": "service.activity",
        "service_id": core.service_id,
        "started_at": core.started_at,
        "parallel": settings.parallel,
        "reserved_sequences": settings.reserved_sequences,
        "models": core.host.loaded(now),
        "engines": core.host.engine_status(),
        "sequences": _sequences(conn, live, now),
        "waiting": [
            _waiting(row, busy, settings, live) for row in task_store.waiting(conn, WAITING_SHOWN)
        ],
        "queue": {"queued": int(queued[0]), "oldest_created_at": queued[1]},
        "clients": task_store.unfinished_by_client(conn),
        "node": core.membership.node_id if core.membership is not None else None,
        "nodes": _nodes(conn) if core.db.shared else [],
        "pulls": [_pull(row) for row in pulls.active(conn)],
    }


def _sequences(conn: Conn, live: list[Sequence], now: float) -> list[dict[str, Any]]:
    """The sequences being generated, each with its task's ids and its speed."""
    slowed = holdups(live)
    shown = []
    for seq in live:
        task = task_store.get(conn, seq.task_id)
        if task is None or task.status.terminal:
            continue  # gone, or ended: its worker has not let go of its slot yet
        rate = seq.rate(now)
        shown.append(
            {
                "task_id": seq.task_id,
                "response_id": task.response_id,
                "client_id": task.client_id,
                "model": seq.model,
                "status": task.status.value,
                "phase": "reading" if seq.reading else "generating",
                "prompt_tokens": seq.prompt_tokens,
                "cached_tokens": seq.cached_tokens,
                # the prompt (with a resume's tokens) as its engine reads it: how far, how fast
                "prompt_read": seq.prompt_read,
                "prompt_total": seq.prompt_total,
                "prompt_tokens_per_second": (
                    None if seq.prompt_rate is None else round(seq.prompt_rate, 1)
                ),
                "output_tokens": seq.tokens,
                "tokens_per_second": None if rate is None else round(rate, 2),
                "started_at": int(seq.started_at),
                "reason": slowed.get(seq.task_id),
            }
        )
    return shown


def _waiting(row: Row, busy: int, settings: Settings, live: list[Sequence]) -> dict[str, Any]:
    return {
        "task_id": row["id"],
        "response_id": row["response_id"],
        "client_id": row["client_id"],
        "model": row["model"],
        "status": row["status"],
        "created_at": row["created_at"],
        "reason": why_waiting(row, busy, settings, live),
    }


def _nodes(conn: Conn) -> list[dict[str, Any]]:
    """The nodes sharing the database (none on SQLite: one node)."""
    held = nodes.held_tasks(conn)
    return [
        {
            "id": row["id"],
            "epoch": row["epoch"],
            "address": row["address"],
            "status": row["status"],
            "lease_seconds_left": round(float(row["lease_left"]), 1),
            "clock_skew_seconds": (
                None if row["clock_skew"] is None else round(float(row["clock_skew"]), 3)
            ),
            "unfinished": int(row["tasks"]),
            "tasks": [
                {"id": t["id"], "status": t["status"], "client_id": t["client_id"]}
                for t in held.get(row["id"], [])
            ],
        }
        for row in nodes.all_nodes(conn)
    ]


def _pull(row: Row) -> dict[str, Any]:
    """A model being pulled from the hub (PROTOCOL.md section 12)."""
    return {
        "task_id": row["task_id"],
        "model": row["model_id"],
        "status": row["status"],
        "bytes": int(row["bytes_done"]),
        "total": int(row["total_bytes"]),
    }


def why_waiting(row: Row, busy: int, settings: Settings, live: list[Sequence]) -> str:
    """Why a task (a row of :func:`lmsp.store.tasks.waiting`) is not generating yet, as
    the claim (store/tasks.py) and the runner's sequences decide: its model loading, its
    client at its ``max_running``, every sequence it may take busy (and a prompt being
    read holding one, if one is)."""
    if row["status"] == "loading":
        return f"loading: the model {row['model']} is being loaded"
    limit = row["max_running"]
    if limit is not None and row["running"] >= limit:
        return f"queued: its client runs its max_running ({limit}) at once"
    parallel, reserved = settings.parallel, settings.reserved_sequences
    newcomer = row["running"] == 0  # a reserved sequence may take it
    if busy < parallel or (newcomer and busy < parallel + reserved):
        return "queued: a sequence is free, starting"
    why = f"queued: all {parallel + (reserved if newcomer else 0)} sequences busy"
    if reserved and not newcomer:
        why += " (the reserved one is for a client with nothing running)"
    readers = [s for s in live if s.reading and s.prompt_total]
    if readers:
        first = max(readers, key=lambda s: s.prompt_total - s.prompt_read)
        why += (
            f"; the prompt of task {first.task_id} is being read"
            f" ({first.prompt_read:,} of {first.prompt_total:,})"
        )
    return why
