"""What a typed record costs to build from its row, beside the read of the row itself.

    .venv/bin/python bench/records.py [--rounds 20000]

One queued response and its task on a real SQLite file: the time of
``TaskRecord.of(row)`` and ``ResponseRecord.of(row)`` per row (the response's request
decoded into a ``PreparedRequest``), and of the ``SELECT *`` that reads each row, the
best of five runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lmsp.protocol.records import ResponseRecord, TaskRecord  # noqa: E402
from lmsp.protocol.request import from_stored  # noqa: E402
from lmsp.store import clients  # noqa: E402
from lmsp.store import responses as response_store  # noqa: E402
from lmsp.store.db import Database  # noqa: E402
from lmsp.store.sql import Conn  # noqa: E402


def per_call(job: Callable[[], Any], rounds: int) -> float:
    """Microseconds per call, the best of five runs."""
    return min(timeit.repeat(job, number=rounds, repeat=5)) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=20000)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(Path(tmp) / "lmsp.db")

        def job(conn: Conn) -> response_store.Created:
            client, _ = clients.add(conn, "bench", ["responses:write"])
            request = {
                "model": "m",
                "input": [{"role": "user", "content": "Hello there, how are you? " * 8}],
                "background": True,
                "temperature": 0.5,
                "metadata": {"a": "b"},
            }
            return response_store.create(
                conn,
                client_id=client.id,
                request=from_stored(request),
                on_restart="fail",
                max_queue=10,
                key=None,
            )

        created = db.write_sync(job)
        conn = db.reader()
        task_sql = ("SELECT * FROM tasks WHERE id = ?", (created.task_id,))
        response_sql = ("SELECT * FROM responses WHERE id = ?", (created.response_id,))
        task_row = conn.execute(*task_sql).fetchone()
        response_row = conn.execute(*response_sql).fetchone()
        figures = {
            "TaskRecord.of": per_call(lambda: TaskRecord.of(task_row), rounds),
            "SELECT * FROM tasks": per_call(lambda: conn.execute(*task_sql).fetchone(), rounds),
            "ResponseRecord.of": per_call(lambda: ResponseRecord.of(response_row), rounds),
            "SELECT * FROM responses": per_call(
                lambda: conn.execute(*response_sql).fetchone(), rounds
            ),
        }
        db.close()
    print(f"records, per row (request of {len(response_row['request'])} bytes):")
    for name, micros in figures.items():
        print(f"  {name:<24} {micros:6.2f} µs")


if __name__ == "__main__":
    main()
