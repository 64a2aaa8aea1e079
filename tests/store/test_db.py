from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from lmsp.protocol.request import from_stored
from lmsp.store.db import Database


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(tmp_path / "lmsp.db")
    yield database  # type: ignore[misc]
    database.close()


def put(key: str, value: str):  # type: ignore[no-untyped-def]
    def job(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO service_config (key, value) VALUES (?, ?)", (key, value))
        return key

    return job


def hold_writer(db: Database) -> threading.Event:
    """Occupy the writer until the returned event is set, so later jobs queue up."""
    release = threading.Event()
    started = threading.Event()

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)

    db.submit(blocker)
    started.wait(10)
    return release


def test_waiting_jobs_share_one_commit(db: Database) -> None:
    release = hold_writer(db)
    commits_before = db.commits
    futures = [db.submit(put(f"k{i}", "v")) for i in range(50)]
    release.set()
    assert [f.result(10) for f in futures] == [f"k{i}" for i in range(50)]
    # the blocker's batch plus at most one more: 50 jobs, one or two commits
    assert db.commits - commits_before <= 2
    count = db.reader().execute("SELECT count(*) FROM service_config").fetchone()[0]
    assert count == 50


def test_a_caller_that_stops_waiting_never_stops_the_writer(db: Database) -> None:
    """An awaiting task cancelled (its HTTP client went away) cancels its future: if the
    writer had not taken the job yet, the job is dropped; if it had, the job ends and is
    answered. Either way the writer goes on (it once died of ``InvalidStateError``)."""
    release = hold_writer(db)
    dropped = db.submit(put("dropped", "x"))
    assert dropped.cancel()
    kept = db.submit(put("kept", "x"))
    release.set()
    assert kept.result(10) == "kept"

    running = threading.Event()
    finish = threading.Event()

    def slow(conn: sqlite3.Connection) -> str:
        running.set()
        finish.wait(10)
        conn.execute("INSERT INTO service_config (key, value) VALUES ('slow', 'x')")
        return "slow"

    taken = db.submit(slow)
    assert running.wait(10)
    assert not taken.cancel()  # the writer holds it: past cancelling
    finish.set()
    assert taken.result(10) == "slow"
    assert db.write_sync(put("after", "x")) == "after"
    keys = {row[0] for row in db.reader().execute("SELECT key FROM service_config")}
    assert {"kept", "slow", "after"} <= keys and "dropped" not in keys


def test_a_failing_job_rolls_back_only_itself(db: Database) -> None:
    release = hold_writer(db)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO service_config (key, value) VALUES ('partial', 'x')")
        raise ValueError("boom")

    ok1 = db.submit(put("a", "1"))
    bad = db.submit(half_then_fail)
    ok2 = db.submit(put("b", "2"))
    release.set()
    assert ok1.result(10) == "a" and ok2.result(10) == "b"
    with pytest.raises(ValueError, match="boom"):
        bad.result(10)
    keys = {r[0] for r in db.reader().execute("SELECT key FROM service_config")}
    assert keys == {"a", "b"}


def test_answers_come_after_the_commit(db: Database, tmp_path: Path) -> None:
    """A write is visible to a brand-new connection as soon as its caller is answered."""
    db.write_sync(put("durable", "yes"))
    other = sqlite3.connect(str(tmp_path / "lmsp.db"))
    assert other.execute("SELECT value FROM service_config WHERE key = 'durable'").fetchone() == (
        "yes",
    )


def test_many_threads_write_concurrently(db: Database) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                db.write_sync(put(f"t{n}-{i}", "v"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.reader().execute("SELECT count(*) FROM service_config").fetchone()[0] == 160
    assert db.jobs >= 160


def test_versions_move_with_client_changes_only(tmp_path: Path) -> None:
    from lmsp.store import clients

    db = Database(tmp_path / "v.db")
    try:
        start = db.versions["clients"]
        made = db.write_sync(lambda c: clients.add(c, "a", ["admin"]))
        added = db.versions["clients"]
        assert added > start
        db.write_sync(lambda c: clients.touch(c, made[0].id, 10_000))  # last_used_at only
        db.write_sync(lambda c: c.execute("CREATE TABLE IF NOT EXISTS other (x)"))
        assert db.versions["clients"] == added
        inside: list[int] = []

        def revoke(conn: sqlite3.Connection) -> None:
            clients.revoke(conn, made[0].id)
            inside.append(db.versions["clients"])

        db.write_sync(revoke)
        # bumped when the row changed, and again once committed (before the answer)
        assert added < inside[0] < db.versions["clients"]
    finally:
        db.close()


def test_task_stamps_move_with_that_task_only(tmp_path: Path) -> None:
    from lmsp.store import clients, responses
    from lmsp.store import tasks as task_store

    db = Database(tmp_path / "t.db")
    try:
        owner = db.write_sync(lambda c: clients.add(c, "a", ["admin"]))[0]

        def create(c: sqlite3.Connection) -> responses.Created:
            request = {"model": "m", "input": "x", "background": True}
            return responses.create(
                c,
                client_id=owner.id,
                request=from_stored(request),
                on_restart="fail",
                max_queue=10,
                key=None,
            )

        first, second = db.write_sync(create), db.write_sync(create)
        a, b = db.versions.task(first.task_id), db.versions.task(second.task_id)
        assert a is not None and b is not None and a != b
        assert db.versions.task("task_unknown") is None  # unknown: readers must read
        db.write_sync(lambda c: task_store.cancel(c, second.task_id))
        assert db.versions.task(first.task_id) == a
        changed = db.versions.task(second.task_id)
        assert changed is not None and changed > b
        db.write_sync(
            lambda c: c.execute("DELETE FROM responses WHERE id = ?", (first.response_id,))
        )
        gone = db.versions.task(first.task_id)
        assert gone is not None and gone > a  # a cascaded delete counts too
    finally:
        db.close()
