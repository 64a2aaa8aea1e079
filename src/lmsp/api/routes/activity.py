"""``GET /v1/service/activity`` (``admin``): what the service is doing now, for
``lmsp ps`` and the console: loaded models with their memory, their engine processes
(pid, restarts, a crash loop's failure), the sequences being generated with their
speed (and a prompt being read, how far and how fast), the tasks waiting and why, the
queue, and the clients with unfinished work. Counts, ids and names only: no prompt or
output text."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lmsp.api.auth import require
from lmsp.api.routes.deps import service
from lmsp.config import Settings
from lmsp.metrics import Sequence, holdups
from lmsp.store import nodes, pulls
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Row

router = APIRouter(prefix="/v1/service", tags=["service"])

Admin = Annotated[Client, Depends(require("admin"))]

#: the waiting tasks listed (the queue's count covers them all)
WAITING_SHOWN = 20


@router.get("/activity")
async def activity(request: Request, client: Admin) -> dict[str, Any]:
    svc = service(request)
    conn = svc.db.reader()
    now = time.monotonic()
    live = svc.metrics.sequences()
    slowed = holdups(live)
    sequences = []
    for seq in live:
        task = task_store.get(conn, seq.task_id)
        if task is None:
            continue
        rate = seq.rate(now)
        sequences.append(
            {
                "task_id": seq.task_id,
                "response_id": task["response_id"],
                "client_id": task["client_id"],
                "model": seq.model,
                "status": task["status"],
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
    busy = svc.runner.busy
    waiting = [
        {
            "task_id": row["id"],
            "response_id": row["response_id"],
            "client_id": row["client_id"],
            "model": row["model"],
            "status": row["status"],
            "created_at": row["created_at"],
            "reason": _why_waiting(row, busy, svc.settings, live),
        }
        for row in task_store.waiting(conn, WAITING_SHOWN)
    ]
    queued = task_store.queue_summary(conn)
    clients = task_store.unfinished_by_client(conn)
    held = nodes.held_tasks(conn) if svc.db.shared else {}
    shared = [  # the nodes sharing the database (none on SQLite: one node)
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
        for row in (nodes.all_nodes(conn) if svc.db.shared else [])
    ]
    return {
        "object": "service.activity",
        "service_id": svc.service_id,
        "started_at": svc.started_at,
        "parallel": svc.settings.parallel,
        "reserved_sequences": svc.settings.reserved_sequences,
        "models": svc.host.loaded(now),
        "engines": svc.host.engine_status(),
        "sequences": sequences,
        "waiting": waiting,
        "queue": {"queued": int(queued[0]), "oldest_created_at": queued[1]},
        "clients": clients,
        "websockets": request.app.state.lmsp_sockets.activity(),
        "node": svc.membership.node_id if svc.membership is not None else None,
        "nodes": shared,
        "pulls": [  # models being pulled from the hub (PROTOCOL.md section 12)
            {
                "task_id": row["task_id"],
                "model": row["model_id"],
                "status": row["status"],
                "bytes": int(row["bytes_done"]),
                "total": int(row["total_bytes"]),
            }
            for row in pulls.active(conn)
        ],
    }


def _why_waiting(task: Row, busy: int, settings: Settings, live: list[Sequence]) -> str:
    """Why a task is not generating yet, as the claim (store/tasks.py) and the runner's
    sequences decide: its model loading, its client at its ``max_running``, every
    sequence it may take busy (and a prompt being read holding one, if one is)."""
    if task["status"] == "loading":
        return f"loading: the model {task['model']} is being loaded"
    limit = task["max_running"]
    if limit is not None and task["running"] >= limit:
        return f"queued: its client runs its max_running ({limit}) at once"
    parallel, reserved = settings.parallel, settings.reserved_sequences
    newcomer = task["running"] == 0  # a reserved sequence may take it
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
