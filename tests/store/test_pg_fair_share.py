"""Fair share on PostgreSQL nodes (PROTOCOL.md 13): the claim query follows the same
fair order as on SQLite (tiers, fewest running, the client served longest ago, FIFO
within a client, ``max_running``) with ``FOR UPDATE SKIP LOCKED`` kept; the usage
ledger and the audit chain work there too."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.bootstrap import bootstrap
from lmsp.protocol.request import from_stored
from lmsp.store import audit, clients, limits, nodes, usage
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.pg import PgDatabase, raw_connect


@pytest.fixture
def db(pg_url: str, tmp_path: Path) -> Iterator[PgDatabase]:
    database = PgDatabase(pg_url)
    bootstrap(database, tmp_path, tmp_path / "blobs", True)
    yield database
    database.close()


def new_client(db: PgDatabase, name: str) -> str:
    return str(db.write_sync(lambda c: clients.add(c, name, ["responses:write"])[0].id))


def queue(db: PgDatabase, client_id: str, tier: str | None = None) -> str:
    request: dict[str, Any] = {"model": "lmsp-test", "input": "x", "background": True}
    if tier is not None:
        request["service_tier"] = tier

    def job(conn: Any) -> str:
        made = response_store.create(
            conn,
            client_id=client_id,
            request=from_stored(request),
            on_restart="fail",
            max_queue=100,
            key=None,
        )
        return made.task_id

    return str(db.write_sync(job))


def claim(db: PgDatabase, node: nodes.Node) -> str | None:
    row = db.write_sync(lambda c: task_store.claim_next(c, node))
    return None if row is None else row.id


def finish(db: PgDatabase, task_id: str) -> None:
    db.write_sync(lambda c: task_store.cancel(c, task_id))
    db.write_sync(lambda c: task_store.finish_cancel(c, task_id))


def position(db: PgDatabase, task_id: str) -> int | None:
    conn = db.reader()
    task = task_store.get(conn, task_id)
    assert task is not None
    return task_store.queue_position(conn, task)


def test_the_claim_query_follows_the_fair_order(db: PgDatabase) -> None:
    node = db.write_sync(lambda c: nodes.join(c, "n1", "n1:1", 30.0))
    heavy, light, urgent = new_client(db, "heavy"), new_client(db, "light"), new_client(db, "u")
    flood = [queue(db, heavy) for _ in range(4)]
    single = queue(db, light)
    flex = queue(db, light, "flex")
    fast = queue(db, urgent, "priority")
    expected = [fast, flood[0], single, *flood[1:], flex]
    assert [position(db, t) for t in expected] == list(range(1, 8))
    order = []
    for _ in range(7):  # one sequence: each ends before the next claim
        claimed = claim(db, node)
        assert claimed is not None
        order.append(claimed)
        finish(db, claimed)
    assert order == expected
    assert claim(db, node) is None


def test_fewest_running_and_max_running_at_claim_time(db: PgDatabase) -> None:
    node = db.write_sync(lambda c: nodes.join(c, "n1", "n1:1", 30.0))
    a, b = new_client(db, "a"), new_client(db, "b")
    db.write_sync(lambda c: limits.update(c, a, {"max_running": 2}))
    a_tasks = [queue(db, a) for _ in range(4)]
    b_tasks = [queue(db, b) for _ in range(2)]
    assert claim(db, node) == a_tasks[0]
    assert claim(db, node) == b_tasks[0]  # b runs none, a one
    assert claim(db, node) == a_tasks[1]  # one each: a was served longer ago
    assert claim(db, node) == b_tasks[1]  # a runs two now, its max_running
    assert claim(db, node) is None  # a's left, held back by max_running
    finish(db, a_tasks[0])
    assert claim(db, node) == a_tasks[2]


def test_the_reserved_sequence_claims_a_newcomer_only(db: PgDatabase) -> None:
    node = db.write_sync(lambda c: nodes.join(c, "n1", "n1:1", 30.0))
    heavy, light, patient = new_client(db, "heavy"), new_client(db, "light"), new_client(db, "p")

    def newcomer() -> str | None:
        row = db.write_sync(lambda c: task_store.claim_next(c, node, newcomer=True))
        return None if row is None else row.id

    flood = [queue(db, heavy) for _ in range(2)]
    assert claim(db, node) == flood[0]
    waiting = queue(db, patient, "flex")
    assert newcomer() is None  # heavy runs one; flex waits for a sequence of its own
    single = queue(db, light)
    urgent = queue(db, heavy, "priority")
    assert newcomer() is None  # a priority task waits: it goes first
    assert claim(db, node) == urgent
    assert newcomer() == single
    assert claim(db, node) == flood[1]
    assert claim(db, node) == waiting


def test_nodes_claiming_at_once_take_different_tasks(db: PgDatabase) -> None:
    one = db.write_sync(lambda c: nodes.join(c, "n1", "n1:1", 30.0))
    two = db.write_sync(lambda c: nodes.join(c, "n2", "n2:1", 30.0))
    owners = [new_client(db, f"c{i}") for i in range(3)]
    queued = {queue(db, owners[i % 3]) for i in range(12)}
    # a second database (another node's writer) so the claims really overlap
    other = PgDatabase(db.url)
    try:
        got: list[str] = []
        lock = threading.Lock()

        def drain(database: PgDatabase, node: nodes.Node) -> None:
            while True:
                task_id = claim(database, node)
                if task_id is None:
                    return
                with lock:
                    got.append(task_id)

        threads = [
            threading.Thread(target=drain, args=(db, one)),
            threading.Thread(target=drain, args=(other, two)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        other.close()
    assert sorted(got) == sorted(queued)  # each claimed once, none lost


def test_usage_ledger_and_audit_chain(db: PgDatabase) -> None:
    node = db.write_sync(lambda c: nodes.join(c, "n1", "n1:1", 30.0))
    a = new_client(db, "a")
    task_id = queue(db, a)
    assert claim(db, node) == task_id
    db.write_sync(lambda c: task_store.start(c, task_id, None))
    used = {"input_tokens": 7, "cached_tokens": 2, "output_tokens": 5, "total_tokens": 12}
    db.write_sync(lambda c: task_store.complete(c, task_id, task_store.Completion([], [], used)))
    rows = usage.summary(db.reader(), a, None, None, ("model",))
    assert [
        (r["requests"], r["input_tokens"], r["cached_tokens"], r["output_tokens"]) for r in rows
    ] == [(1, 7, 2, 5)]
    for i in range(3):
        db.write_sync(lambda c, i=i: audit.record(c, "owner", "client.limits_changed", a, {"n": i}))
    assert audit.verify(db.reader()) == (3, None, "")
    raw = raw_connect(db.url)
    try:
        with pytest.raises(Exception, match="append-only"):
            raw.execute("UPDATE audit_log SET change = '{}' WHERE id = 2")
        raw.execute("ALTER TABLE audit_log DISABLE TRIGGER lmsp_audit_append_only")
        raw.execute("UPDATE audit_log SET change = '{\"n\":9}' WHERE id = 2")
    finally:
        raw.close()
    checked, broken, _ = audit.verify(db.reader())
    assert (checked, broken) == (1, 2)
