"""Two nodes' writers that lock the same rows in opposite orders deadlock; PostgreSQL
aborts one of the two transactions. The aborted batch runs again as a whole (nothing of
it was answered yet), so both writes succeed: a deadlock inside a job is not that job's
failure (it used to answer the request with it: a cancel on a node pair ended in ``500``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from lmsp.store.pg import PgDatabase


@pytest.fixture
def nodes(pg_url: str) -> Iterator[tuple[PgDatabase, PgDatabase]]:
    a, b = PgDatabase(pg_url, readers=1), PgDatabase(pg_url, readers=1)
    yield a, b
    a.close()
    b.close()


def test_a_deadlocked_batch_runs_again_and_both_writes_land(
    nodes: tuple[PgDatabase, PgDatabase],
) -> None:
    a, b = nodes
    a.write_sync(lambda c: c.execute("CREATE TABLE probe_rows (id INTEGER PRIMARY KEY, n INTEGER)"))
    a.write_sync(lambda c: c.execute("INSERT INTO probe_rows VALUES (1, 0), (2, 0)"))
    both = threading.Barrier(2, timeout=30)
    tries: list[str] = []

    def crossing(first: int, second: int, name: str) -> Any:
        def job(conn: Any) -> int:
            tries.append(name)
            conn.execute("UPDATE probe_rows SET n = n + 1 WHERE id = ?", (first,))
            if tries.count(name) == 1:  # the first try meets the other in the middle
                both.wait()
            conn.execute("UPDATE probe_rows SET n = n + 1 WHERE id = ?", (second,))
            return second

        return job

    one = a.submit(crossing(1, 2, "a"))
    two = b.submit(crossing(2, 1, "b"))
    assert (one.result(60), two.result(60)) == (2, 1)  # neither answered with the deadlock
    assert len(tries) == 3  # one of the two ran again
    rows = dict(a.reader().execute("SELECT id, n FROM probe_rows").fetchall())
    assert rows == {1: 2, 2: 2}
