"""(q) A deep queue (issue 40): what a claim and a create's write cost behind it.

An agent may queue thousands of background responses at once; each claim picks the
next task in the fair order (PROTOCOL.md 13) and each create answers with its task's
place in that order. In process, on the store alone (SQLite, the data directory's
own schema): ``depth`` queued tasks of four clients in two tiers, then the median
time of one claim (``claim_next``, in the writer's transaction) and of one create's
write (``responses.create`` and the ``response.created`` object it answers with,
its queue position included), each inside its transaction (the commit, the same at
any depth, left out).

    .venv/bin/python bench/run.py --only backlog
    .venv/bin/python bench/backlog.py [--depths 100,1000,10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.clients import median  # noqa: E402

from lmsp.app.root import open_service  # noqa: E402
from lmsp.app.service import Service  # noqa: E402
from lmsp.config import Settings  # noqa: E402
from lmsp.protocol.request import from_stored  # noqa: E402
from lmsp.store import clients  # noqa: E402
from lmsp.store import responses as response_store  # noqa: E402
from lmsp.store import tasks as task_store  # noqa: E402
from lmsp.store.sql import Conn  # noqa: E402

Table = Callable[[str, list[str], list[list[str]]], None]
TIERS = ("default", "flex")
SAMPLES = 40


def _create(svc: Service, client_id: str, tier: str) -> float:
    """The create's write, in ms (inside its transaction: the commit left out)."""
    request: dict[str, Any] = {
        "model": "lmsp-test",
        "input": "x",
        "background": True,
        "service_tier": tier,
    }

    def job(conn: Conn) -> float:
        began = time.perf_counter()
        created = response_store.create(
            conn,
            client_id=client_id,
            request=from_stored(request),
            on_restart="fail",
            max_queue=10**9,
            key=None,
        )
        task = task_store.get(conn, created.task_id)
        assert task is not None
        task_store.render_response(conn, task)  # the object the 202 carries
        return (time.perf_counter() - began) * 1000

    return float(svc.db.write_sync(job))


def _claim(svc: Service) -> float:
    """A claim, in ms (inside its transaction)."""

    def job(conn: Conn) -> float:
        began = time.perf_counter()
        assert task_store.claim_next(conn) is not None
        return (time.perf_counter() - began) * 1000

    return float(svc.db.write_sync(job))


def measure(work: Path, depth: int) -> tuple[float, float]:
    """(a claim's ms, a create's ms) behind ``depth`` queued tasks, medians."""
    settings = Settings(
        data_dir=work,
        enable_test_engine=True,
        gc_interval=3600,
        in_thread_engines=frozenset({"test"}),
    )
    svc = open_service(settings)
    try:
        ids = [
            svc.db.write_sync(lambda c, i=i: clients.add(c, f"agent{i}", ["responses:write"]))[0].id
            for i in range(4)
        ]
        for n in range(depth):
            _create(svc, ids[n % len(ids)], TIERS[n % len(TIERS)])
        creates = [_create(svc, ids[i % len(ids)], "default") for i in range(SAMPLES)]
        claims = [_claim(svc) for _ in range(SAMPLES)]
    finally:
        svc.runner.stop()
        svc.host.close()
        svc.db.close()
    return median(claims), median(creates)


def bench_backlog(work: Path, table: Table, depths: tuple[int, ...] = (100, 1_000, 10_000)) -> None:
    rows = []
    for depth in depths:
        claim, create = measure(work / f"q{depth}", depth)
        rows.append([f"{depth:,}", f"{claim:.3f} ms", f"{create:.3f} ms"])
    table(
        "(q) a deep queue: a claim and a create's write behind it (SQLite, in process, "
        f"medians of {SAMPLES}; four clients, two tiers)",
        ["queued tasks", "a claim", "a create's write (its 202 object included)"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="100,1000,10000")
    args = parser.parse_args()
    from bench.run import table

    with tempfile.TemporaryDirectory(prefix="lmsp-backlog-") as work:
        bench_backlog(Path(work), table, tuple(int(v) for v in args.depths.split(",") if v))


if __name__ == "__main__":
    main()
