"""Startup recovery (chapter 11.3): every cell of the table, on both stores (SQLite files and a
PostgreSQL database).

Each test prepares a data directory with the store's own verbs (create, claim, start,
log output with its snapshot, cancel), closes it as a stopped service would leave it,
then starts the service on it and checks the state, the events recovery wrote, and
how the task ends once the runner takes over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.app.root import open_service
from lmsp.app.service import Service
from lmsp.bootstrap import bootstrap
from lmsp.config import Settings
from lmsp.engines import deterministic
from lmsp.engines.base import Piece, Sampling
from lmsp.engines.deterministic import TEST_MODEL_ID
from lmsp.protocol.assembler import OutputAssembler
from lmsp.protocol.request import from_stored
from lmsp.runner.plan import messages_of
from lmsp.store import models, snapshots
from lmsp.store import responses as response_store
from lmsp.store import service as service_store
from lmsp.store import tasks as task_store
from lmsp.store.open import open_database
from tests.helpers import TERMINAL_EVENTS, check_log_invariants, task_log, text_events
from tests.pgcluster import store_reader


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """Every test here runs on both stores."""
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"), lease_ttl=5.0)


STATES = ["queued", "loading", "running", "cancelling"]
POLICIES = ["fail", "retry", "resume"]

#: Chapter 11.3, written out independently of ``lmsp.protocol.states``.
TABLE = {
    "queued": {"fail": "failed", "retry": "queued", "resume": "queued"},
    "loading": {"fail": "failed", "retry": "queued", "resume": "queued"},
    "running": {"fail": "failed", "retry": "queued", "resume": "running"},
    "cancelling": {"fail": "cancelled", "retry": "cancelled", "resume": "cancelled"},
}
#: How many tokens a ``running``/``cancelling`` task had produced before the stop.
DONE_BEFORE = 7


@dataclass
class Prepared:
    found: str
    policy: str
    task_id: str
    response_id: str
    request: dict[str, Any]
    last_seq: int
    snapshot_text: str


def engine_pieces(request: dict[str, Any]) -> list[Piece]:
    """What an uninterrupted run of ``request`` writes (the test engine is deterministic)."""
    prompt = deterministic.DeterministicModel().prompt_tokens(messages_of(from_stored(request)))
    temperature = request.get("temperature")
    sampling = Sampling(
        temperature=1.0 if temperature is None else float(temperature), seed=int(request["seed"])
    )
    return deterministic.reference(prompt, sampling)


def engine_text(request: dict[str, Any]) -> str:
    return "".join(piece.text for piece in engine_pieces(request))


def new_data_dir(settings: Settings) -> None:
    db = open_database(settings)
    try:
        bootstrap(db, settings.data_dir, settings.blobs_dir, True)
    finally:
        db.close()


def prepare(settings: Settings, found: str, policy: str, seed: int) -> Prepared:
    """Create one response and leave its task in ``found``, then close the database."""
    request: dict[str, Any] = {
        "model": TEST_MODEL_ID,
        "input": f"recovery of a {found} task with on_restart={policy}",
        "background": True,
        "seed": seed,
        "on_restart": policy,
    }
    generated = engine_pieces(request)
    pieces = [p.text for p in generated]
    tokens = [p.token for p in generated]

    def job(conn: Any) -> tuple[str, str, str]:
        owner = service_store.get(conn, "owner_client_id")
        assert owner is not None
        created = response_store.create(
            conn,
            client_id=owner,
            request=from_stored(request),
            on_restart=policy,
            max_queue=100,
            key=None,
        )
        task_id = created.task_id
        text = ""
        if found == "queued":
            return created.response_id, task_id, text
        claimed = task_store.claim_next(conn)
        assert claimed is not None and claimed.id == task_id
        if found == "loading":
            return created.response_id, task_id, text
        record = models.get(conn, TEST_MODEL_ID)
        assert record is not None
        assert task_store.start(conn, task_id, record.digest) is not None
        # two batches, as the runner logs them, each with the snapshot covering it
        assembler = OutputAssembler()
        for lo, hi in ((0, 3), (3, DONE_BEFORE)):
            text = "".join(pieces[:hi])
            snap = {"tokens": tokens[:hi], "seed": seed}
            batch = text_events(assembler, pieces[lo:hi])
            assert task_store.append_output(conn, task_id, batch, snap)
        if found == "cancelling":
            moved = task_store.cancel(conn, task_id)
            assert moved is not None and moved.status == "cancelling"
        return created.response_id, task_id, text

    db = open_database(settings)
    try:
        response_id, task_id, snapshot_text = db.write_sync(job)
        task = task_store.get(db.reader(), task_id)
        assert task is not None and task.status == found
        last_seq = task.last_sequence_number
    finally:
        db.close()
    return Prepared(found, policy, task_id, response_id, request, last_seq, snapshot_text)


@contextmanager
def started(settings: Settings) -> Iterator[Service]:
    """``open_service`` (bootstrap + recovery, runner not started yet) with cleanup."""
    svc = open_service(settings)
    try:
        yield svc
    finally:
        svc.runner.stop()
        svc.host.close()
        svc.db.close()


def wait_terminal(settings: Settings, task_ids: list[str], timeout: float = 30) -> None:
    """Poll the database until every task is finished (a wait, not an assertion on time)."""
    deadline = time.monotonic() + timeout
    conn = store_reader(settings)
    try:
        while True:
            rows = conn.execute(
                f"SELECT status FROM tasks WHERE id IN ({','.join('?' * len(task_ids))})",
                task_ids,
            ).fetchall()
            if all(r[0] in ("completed", "failed", "cancelled") for r in rows):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"tasks not finished: {[r[0] for r in rows]}")
            time.sleep(0.01)
    finally:
        conn.close()


def deltas(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def check_recovered(svc: Service, prep: Prepared) -> None:
    """The state and events right after recovery, before the runner has run."""
    expected = TABLE[prep.found][prep.policy]
    conn = store_reader(svc.settings)
    try:
        task = conn.execute("SELECT * FROM tasks WHERE id = ?", (prep.task_id,)).fetchone()
        log = task_log(conn, prep.task_id)
    finally:
        conn.close()
    assert task["status"] == expected
    new = log[prep.last_seq + 1 :]
    report = svc.recovered
    if expected == "failed":
        assert [e["type"] for e in new] == ["response.failed"]
        assert task["error_code"] == "server_restarted"
        assert new[0]["response"]["status"] == "failed"
        assert new[0]["response"]["error"]["code"] == "server_restarted"
        assert task["finished_at"] is not None
        assert report.failed == [prep.task_id]
    elif expected == "cancelled":
        assert [e["type"] for e in new] == ["response.cancelled"]
        assert new[0]["response"]["status"] == "cancelled"
        assert task["error_code"] is None
        assert report.cancelled == [prep.task_id]
    elif expected == "queued" and prep.found == "queued":
        assert new == []  # queued → queued: no event
        assert task["attempt"] == 1
        assert report.kept_queued == [prep.task_id]
    elif expected == "queued":
        assert [e["type"] for e in new] == ["response.queued"]
        event = new[0]
        assert event["attempt"] == 2 and task["attempt"] == 2
        assert event["response"]["task"]["attempt"] == 2
        assert event["response"]["status"] == "queued"
        if prep.policy == "retry":
            assert event["reset"] is True
            assert task["snapshot"] is None  # the partial output is discarded
        else:
            assert "reset" not in event
        assert report.requeued == [prep.task_id]
    else:
        assert expected == "running"
        assert new == []  # the runner logs the resume, continuing the same sequence
        assert task["attempt"] == 1
        assert task["snapshot"] is not None
        assert report.resumed == [prep.task_id]
    # nothing else was touched
    moved = report.failed + report.cancelled + report.requeued + report.kept_queued
    assert sorted(moved + report.resumed) == [prep.task_id]


def check_final(settings: Settings, prep: Prepared, final: dict[str, Any]) -> None:
    """How the task ended once the service ran it; ``final`` is its response object."""
    expected = TABLE[prep.found][prep.policy]
    conn = store_reader(settings)
    try:
        log = task_log(conn, prep.task_id)
        check_log_invariants(conn)
    finally:
        conn.close()
    full = engine_text(prep.request)
    assert log[-1]["type"] in TERMINAL_EVENTS
    if expected in ("failed", "cancelled"):
        assert final["status"] == expected
        assert len(log) == prep.last_seq + 2  # only recovery's terminal event was added
        if expected == "failed":
            assert final["error"]["code"] == "server_restarted"
        return
    assert final["status"] == "completed", final
    assert log[-1]["type"] == "response.completed"
    assert final["output"][0]["content"][0]["text"] == full
    after = log[prep.last_seq + 1 :]
    if expected == "running":
        # resume: in_progress (resumed) first, then the remaining text, nothing repeated
        assert after[0]["type"] == "response.in_progress"
        assert after[0]["resumed"] is True
        assert prep.snapshot_text and full.startswith(prep.snapshot_text)
        assert prep.snapshot_text + deltas(after) == full
        assert deltas(log) == full
        assert [e["type"] for e in log].count("response.output_item.added") == 1
        assert final["task"]["attempt"] == 1
    elif prep.found == "queued":
        assert deltas(log) == full
        assert final["task"]["attempt"] == 1
    else:
        # requeued: the new attempt writes the whole text after the requeue event
        assert after[0]["type"] == "response.queued"
        assert deltas(after) == full
        assert final["task"]["attempt"] == 2
        if prep.policy == "resume":  # a loading task had no output to keep
            assert deltas(log) == full


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("found", STATES)
def test_recovery_table_cell(settings: Settings, found: str, policy: str) -> None:
    new_data_dir(settings)
    prep = prepare(settings, found, policy, seed=1000 + STATES.index(found))
    with started(settings) as svc:
        check_recovered(svc, prep)
        svc.runner.start(resume=svc.recovered.resumed)
        wait_terminal(settings, [prep.task_id])
        final = svc.response_object(prep.task_id)
    check_final(settings, prep, final)


@pytest.mark.parametrize("policy", ["resume", "retry"])
def test_a_running_task_with_its_tokens_in_chunks(
    settings: Settings, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tail of 2 tokens, the 7 tokens a stopped task had produced sit in chunks
    (sealed at 3 and at 7): resume continues from them exactly (and goes on sealing),
    retry discards them with the snapshot."""
    monkeypatch.setattr(snapshots, "SEAL", 2)
    new_data_dir(settings)
    prep = prepare(settings, "running", policy, seed=77)

    def starts() -> list[int]:
        conn = store_reader(settings)
        try:
            rows = conn.execute(
                "SELECT start FROM task_tokens WHERE task_id = ? ORDER BY start", (prep.task_id,)
            )
            return [int(r[0]) for r in rows]
        finally:
            conn.close()

    assert starts() == [0, 3]
    with started(settings) as svc:
        check_recovered(svc, prep)
        assert starts() == ([0, 3] if policy == "resume" else [])
        svc.runner.start(resume=svc.recovered.resumed)
        wait_terminal(settings, [prep.task_id])
        final = svc.response_object(prep.task_id)
    check_final(settings, prep, final)
    assert starts() == []  # a finished task keeps no snapshot


def test_all_cells_through_the_http_app(settings: Settings) -> None:
    """All 12 leftovers in one database; the real app (lifespan: recovery, then runner)."""
    new_data_dir(settings)
    # tasks found queued are created last, so each claim takes the task just created
    order = [(f, p) for f in STATES if f != "queued" for p in POLICIES]
    order += [("queued", p) for p in POLICIES]
    preps = [prepare(settings, f, p, seed=7 + i) for i, (f, p) in enumerate(order)]
    with TestClient(create_app(settings)) as client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        finals: dict[str, dict[str, Any]] = {}
        for prep in preps:
            with client.stream(
                "GET",
                f"/v1/responses/{prep.response_id}",
                params={
                    "stream": "true",
                    "starting_after": prep.last_seq,
                    "include": "lmsp.lifecycle",  # the whole log, LMSP extensions too
                },
            ) as stream:
                body = stream.read().decode()
            # the stream continues the log exactly after the last event before the stop
            first_id = next(line for line in body.splitlines() if line.startswith("id:"))
            assert int(first_id.split(":", 1)[1]) == prep.last_seq + 1
            finals[prep.task_id] = client.get(f"/v1/responses/{prep.response_id}").json()
    for prep in preps:
        check_final(settings, prep, finals[prep.task_id])
    counts = {"failed": 0, "cancelled": 0, "completed": 0}
    for final in finals.values():
        counts[final["status"]] += 1
    assert counts == {"failed": 3, "cancelled": 3, "completed": 6}


def test_recovery_twice_changes_nothing_more(settings: Settings) -> None:
    """A second restart before the runner ran anything finds the table already applied."""
    new_data_dir(settings)
    order = [(f, p) for f in STATES if f != "queued" for p in POLICIES]
    order += [("queued", p) for p in POLICIES]
    preps = [prepare(settings, f, p, seed=50 + i) for i, (f, p) in enumerate(order)]
    with started(settings) as first:
        assert len(first.recovered.failed) == 3
        assert len(first.recovered.cancelled) == 3
        assert len(first.recovered.requeued) == 3  # loading retry/resume, running retry
        assert len(first.recovered.kept_queued) == 2
        assert len(first.recovered.resumed) == 1
    conn = store_reader(settings)
    logs = {p.task_id: task_log(conn, p.task_id) for p in preps}
    conn.close()
    with started(settings) as second:
        report = second.recovered
        assert report.failed == report.cancelled == report.requeued == []
        assert len(report.kept_queued) == 5 and len(report.resumed) == 1
    conn = store_reader(settings)
    try:
        assert {p.task_id: task_log(conn, p.task_id) for p in preps} == logs
        check_log_invariants(conn)
    finally:
        conn.close()


def test_cancel_of_a_resumed_task_before_the_runner_takes_it(settings: Settings) -> None:
    """A running+resume task cancelled after recovery, before its runner slot is free,
    must still end ``cancelled`` (not stay ``cancelling`` forever)."""
    new_data_dir(settings)
    prep = prepare(settings, "running", "resume", seed=99)
    with started(settings) as svc:
        assert svc.recovered.resumed == [prep.task_id]
        moved = svc.db.write_sync(lambda c: task_store.cancel(c, prep.task_id))
        assert moved is not None and moved.status == "cancelling"
        svc.runner.request_cancel(prep.task_id)
        svc.runner.start(resume=svc.recovered.resumed)
        wait_terminal(settings, [prep.task_id])
        final = svc.response_object(prep.task_id)
    assert final["status"] == "cancelled"
    conn = store_reader(settings)
    try:
        log = task_log(conn, prep.task_id)
        assert [e["type"] for e in log[prep.last_seq + 1 :]] == [
            "response.cancelling",
            "response.cancelled",
        ]
        check_log_invariants(conn)
    finally:
        conn.close()


@pytest.mark.parametrize("found", ["running", "queued"])
def test_the_model_of_a_left_task_loads_before_the_runner_asks(
    settings: Settings, found: str
) -> None:
    """After a restart the engine of the model unfinished tasks will run starts while
    recovery and the server start: its load is not on the resumed task's time."""
    new_data_dir(settings)
    prep = prepare(settings, found, "resume", seed=7)
    with started(settings) as svc:
        assert [r.id for r in models.awaited(svc.db.reader())] == [TEST_MODEL_ID]
        deadline = time.monotonic() + 30
        while not svc.host.is_loaded(TEST_MODEL_ID) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert svc.host.is_loaded(TEST_MODEL_ID)  # the runner has not started
        svc.runner.start(resume=svc.recovered.resumed)
        wait_terminal(settings, [prep.task_id])
        assert svc.response_object(prep.task_id)["status"] == "completed"


def test_nothing_loads_ahead_when_no_task_is_left(settings: Settings) -> None:
    new_data_dir(settings)
    prep = prepare(settings, "queued", "fail", seed=8)
    conn = store_reader(settings)
    try:
        assert conn.execute("SELECT status FROM tasks").fetchone()[0] == "queued"
    finally:
        conn.close()
    db = open_database(settings)
    try:  # the task ends: nothing is left for a restart to load
        db.write_sync(lambda c: task_store.cancel(c, prep.task_id))
        assert models.awaited(db.reader()) == []
    finally:
        db.close()
    with started(settings) as svc:
        assert svc.host.warm(models.awaited(svc.db.reader())) is None
        assert not svc.host.is_loaded(TEST_MODEL_ID)
