"""Nodes on one PostgreSQL database, in process: claims that pass over each other's rows,
claims only of models a node has, fenced writes, and the rescuer's recovery table with
``node_lost`` (every cell)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.bootstrap import bootstrap
from lmsp.cluster.nodes import Membership
from lmsp.protocol.assembler import OutputAssembler
from lmsp.protocol.request import from_stored
from lmsp.protocol.states import Status
from lmsp.store import models, nodes
from lmsp.store import responses as response_store
from lmsp.store import service as service_store
from lmsp.store import tasks as task_store
from lmsp.store.pg import PgDatabase
from tests.helpers import check_log_invariants, task_log, text_events

TABLE = {  # chapter 11.3, as the rescuer applies it to a lost node's tasks
    "loading": {"fail": "failed", "retry": "queued", "resume": "queued"},
    "running": {"fail": "failed", "retry": "queued", "resume": "running"},
    "cancelling": {"fail": "cancelled", "retry": "cancelled", "resume": "cancelled"},
}


@pytest.fixture
def db(pg_url: str, tmp_path: Path) -> Iterator[PgDatabase]:
    database = PgDatabase(pg_url)
    bootstrap(database, tmp_path, tmp_path / "blobs", True)
    yield database
    database.close()


def enqueue(db: PgDatabase, policy: str = "fail") -> str:
    request = {"model": "lmsp-test", "input": "x", "background": True, "seed": 1}

    def job(conn: Any) -> str:
        owner = service_store.get(conn, "owner_client_id")
        created = response_store.create(
            conn,
            client_id=owner,
            request=from_stored(request),
            on_restart=policy,
            max_queue=100,
            key=None,
        )
        return created.task_id

    return str(db.write_sync(job))


def join(db: PgDatabase, name: str, ttl: float = 30.0) -> nodes.Node:
    return db.write_sync(lambda c: nodes.join(c, name, f"{name}:1", ttl))


def test_claims_pass_over_rows_another_node_is_claiming(db: PgDatabase) -> None:
    first, second = enqueue(db), enqueue(db)
    a, b = join(db, "a"), join(db, "b")
    other = PgDatabase(db.url)  # a second node's writer
    try:
        holding = threading.Event()
        release = threading.Event()
        claimed: dict[str, Any] = {}

        def slow_claim(conn: Any) -> None:
            claimed["a"] = task_store.claim_next(conn, a)
            holding.set()
            release.wait(10)  # node a's transaction stays open, its row locked

        pending = db.submit(slow_claim)
        assert holding.wait(10)
        began = time.monotonic()
        claimed["b"] = other.write_sync(lambda c: task_store.claim_next(c, b))
        waited = time.monotonic() - began
        release.set()
        pending.result(10)
    finally:
        other.close()
    assert claimed["a"].id == first and claimed["b"].id == second
    assert waited < 5  # b did not wait for a's lock: it took the next row
    rows = {r["id"]: r for r in db.reader().execute("SELECT * FROM tasks")}
    assert rows[first]["node_id"] == "a" and rows[second]["node_id"] == "b"


def test_a_node_claims_only_models_it_has(db: PgDatabase) -> None:
    task_id = enqueue(db)
    a = join(db, "a")
    assert db.write_sync(lambda c: task_store.claim_next(c, a, [])) is None
    record = models.get(db.reader(), "lmsp-test")
    assert record is not None
    claimed = db.write_sync(lambda c: task_store.claim_next(c, a, [record.digest]))
    assert claimed is not None and claimed.id == task_id


def test_writes_are_fenced_by_node_and_lease_epoch(db: PgDatabase) -> None:
    task_id = enqueue(db)
    a = join(db, "a", ttl=1.0)
    db.write_sync(lambda c: task_store.claim_next(c, a))
    db.write_sync(lambda c: nodes.fence(c, task_id, a))  # holds it: passes
    stale = nodes.Node("a", a.epoch - 1)
    with pytest.raises(nodes.LeaseLost):
        db.write_sync(lambda c: nodes.fence(c, task_id, stale))
    with pytest.raises(nodes.LeaseLost):
        db.write_sync(lambda c: nodes.fence(c, task_id, nodes.Node("b", a.epoch)))
    time.sleep(1.2)  # the lease runs out (by the database's clock)
    with pytest.raises(nodes.LeaseLost):
        db.write_sync(lambda c: nodes.fence(c, task_id, a))
    assert not db.write_sync(lambda c: nodes.renew(c, a, 1.0))  # too late to renew


def _leave_in(db: PgDatabase, node: nodes.Node, found: str, policy: str) -> tuple[str, int]:
    task_id = enqueue(db, policy)
    db.write_sync(lambda c: task_store.claim_next(c, node))
    if found in ("running", "cancelling"):
        db.write_sync(lambda c: task_store.start(c, task_id, None))
        batch = text_events(OutputAssembler(), ["one ", "two "])
        snap = {"tokens": [1, 2], "seed": 1}
        assert db.write_sync(lambda c: task_store.append_output(c, task_id, batch, snap))
    if found == "cancelling":
        db.write_sync(lambda c: task_store.cancel(c, task_id))
    row = task_store.get(db.reader(), task_id)
    assert row is not None and row.status == found
    return task_id, row.last_sequence_number


def test_the_rescuer_applies_the_recovery_table_with_node_lost(db: PgDatabase) -> None:
    lost = join(db, "lost", ttl=1.0)
    left = {
        (found, policy): _leave_in(db, lost, found, policy)
        for found in TABLE
        for policy in ("fail", "retry", "resume")
    }
    rescuer = Membership(db, "rescuer", "rescuer:1", 30.0)
    rescuer.join()
    assert rescuer.rescue().outcomes == []  # the lease is still live: nothing to do
    time.sleep(1.2)
    report = rescuer.rescue()
    assert len(report.outcomes) == len(left)
    conn = db.reader()
    for (found, policy), (task_id, last) in left.items():
        row = task_store.get(conn, task_id)
        assert row is not None
        expected = TABLE[found][policy]
        assert row.status == expected, (found, policy)
        new = [e["type"] for e in task_log(conn, task_id)[last + 1 :]]
        if expected == "failed":
            assert row.error_code == "node_lost" and new == ["response.failed"]
        elif expected == "cancelled":
            assert new == ["response.cancelled"]
        elif expected == "queued":
            assert new == ["response.queued"] and row.node_id is None
        else:  # left running, held by nobody: the next claim resumes it
            assert new == [] and row.node_id is None and row.snapshot is not None
    assert rescuer.rescue().outcomes == []  # a second pass changes nothing
    node = nodes.Node("rescuer", rescuer.node.epoch if rescuer.node else 0)
    resumed = db.write_sync(lambda c: task_store.claim_next(c, node))
    assert resumed is not None and resumed.status == Status.RUNNING
    assert resumed.id == left[("running", "resume")][0]
    check_log_invariants(conn)
