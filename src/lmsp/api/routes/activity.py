"""``GET /v1/service/activity`` (``admin``): what the service is doing now, for
``lmsp ps`` and the console: loaded models with their memory, their engine processes
(pid, restarts, a crash loop's failure), the sequences being generated with their
speed, the queue, and the clients with unfinished work. Counts, ids and names only: no
prompt or output text."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lmsp.store import nodes, pulls
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client

from ..auth import require
from .deps import service

router = APIRouter(prefix="/v1/service", tags=["service"])

Admin = Annotated[Client, Depends(require("admin"))]


@router.get("/activity")
async def activity(request: Request, client: Admin) -> dict[str, Any]:
    svc = service(request)
    conn = svc.db.reader()
    now = time.monotonic()
    sequences = []
    for seq in svc.metrics.sequences():
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
                "prompt_tokens": seq.prompt_tokens,
                "cached_tokens": seq.cached_tokens,
                "output_tokens": seq.tokens,
                "tokens_per_second": None if rate is None else round(rate, 2),
                "started_at": int(seq.started_at),
            }
        )
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
        "queue": {"queued": int(queued[0]), "oldest_created_at": queued[1]},
        "clients": clients,
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
