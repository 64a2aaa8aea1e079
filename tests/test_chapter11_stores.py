"""Chapter 11.2's rules, on both stores (SQLite and PostgreSQL): a task is persisted
before ``202``, event numbers and status move in one transaction, and retention never
deletes an unfinished task. (The cancel race and the recovery table run on both stores
in tests/runner/test_runner.py and tests/runner/test_recovery.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.app.root import open_service
from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.protocol.states import Status
from lmsp.runner.retention import sweep
from lmsp.store import events
from lmsp.store import tasks as task_store
from tests.helpers import check_log_invariants, task_log
from tests.pgcluster import store_reader
from tests.runner.test_runner import enqueue

DAY = 86400


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"))


@pytest.fixture
def svc(settings: Settings) -> Iterator[Service]:
    service = open_service(settings)
    yield service
    service.runner.stop()
    service.host.close()
    service.db.close()


def test_a_task_is_persisted_before_202(settings: Settings) -> None:
    body = {"model": "lmsp-test", "input": "persist me", "background": True, "seed": 5}
    with TestClient(create_app(settings)) as client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        svc: Service = client.app.state.lmsp  # type: ignore[attr-defined]
        svc.runner.pause()  # nothing runs it: what is read is what the create committed
        answer = client.post("/v1/responses", json=body)
        assert answer.status_code == 202
        response_id = answer.json()["id"]
        other = store_reader(settings)  # a connection of its own, opened after the 202
        try:
            task = other.execute(
                "SELECT * FROM tasks WHERE response_id = ?", (response_id,)
            ).fetchone()
            assert task is not None and task["status"] == "queued"
            kinds = [e["type"] for e in task_log(other, task["id"])]
            assert kinds == ["response.created", "response.queued"]
            assert task["last_sequence_number"] == 1
        finally:
            other.close()


def test_status_and_sequence_move_in_one_transaction(svc: Service) -> None:
    task_id = enqueue(svc)

    def broken(conn: Any) -> None:
        task_store.move(conn, task_id, Status.LOADING)  # writes the status and an event
        events.append(conn, task_id, [{"type": "response.in_progress"}])
        raise RuntimeError("the job fails after both writes")

    with pytest.raises(RuntimeError):
        svc.db.write_sync(broken)
    conn = svc.db.reader()
    task = task_store.get(conn, task_id)
    assert task is not None and task.status == "queued"
    assert task.last_sequence_number == 1  # neither the status nor an event landed
    assert len(task_log(conn, task_id)) == 2

    moved = svc.db.write_sync(lambda c: task_store.move(c, task_id, Status.LOADING))
    assert moved is not None and moved.status == "loading"
    log = task_log(conn, task_id)
    assert moved.last_sequence_number == log[-1]["sequence_number"] == 2
    check_log_invariants(conn)


def _backdate(svc: Service, task_id: str, seconds: int) -> None:
    def job(conn: Any) -> None:
        conn.execute(
            "UPDATE tasks SET created_at = created_at - ?, updated_at = updated_at - ?,"
            " finished_at = finished_at - ? WHERE id = ?",
            (seconds, seconds, seconds, task_id),
        )

    svc.db.write_sync(job)


def test_retention_never_deletes_unfinished_tasks(svc: Service) -> None:
    done = enqueue(svc)
    svc.runner.run_next()
    cancelled = enqueue(svc)
    svc.db.write_sync(lambda c: task_store.cancel(c, cancelled))
    unfinished = {}
    for status in ("queued", "loading", "running", "cancelling"):
        task_id = enqueue(svc)
        unfinished[task_id] = status
        if status != "queued":
            svc.db.write_sync(lambda c, t=task_id: task_store.move(c, t, Status.LOADING))
        if status in ("running", "cancelling"):
            svc.db.write_sync(lambda c, t=task_id: task_store.start(c, t, None))
        if status == "cancelling":
            svc.db.write_sync(lambda c, t=task_id: task_store.cancel(c, t))
    for task_id in (done, cancelled, *unfinished):
        _backdate(svc, task_id, 30 * DAY)

    swept = sweep(svc.db, retention=0)

    assert swept.responses == 2
    conn = svc.db.reader()
    left = {r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM tasks")}
    assert left == unfinished
    check_log_invariants(conn)
