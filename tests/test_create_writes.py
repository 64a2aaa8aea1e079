"""What a durable create costs the writer (issue 40): its task's claim and start are one
writer job when the model is loaded already, a batch of output the writer has not begun
joins the next write (the terminal one included), and an idle worker's look for a task
is a read, not a write transaction.

The counts are the writer's own (``lmsp_write_jobs_per_transaction_sum`` on
``/metrics``: every job it ran), not times."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx

from lmsp.app.service import Service
from lmsp.protocol.states import Status
from lmsp.store import tasks as task_store
from tests.helpers import check_log_invariants, finish, open_db, served, task_log
from tests.runner.test_runner import enqueue, status

JOBS = "lmsp_write_jobs_per_transaction_sum"
BODY = {"model": "lmsp-test", "input": "hello", "background": True}
#: the test engine at full speed, and no retention sweep in the test's minute
QUIET = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_GC_INTERVAL": "1h"}


def jobs(http: httpx.Client) -> int:
    found = re.search(rf"^{JOBS} ([0-9.e+]+)$", http.get("/metrics").text, re.M)
    assert found is not None
    return int(float(found.group(1)))


def test_a_plain_create_costs_the_writer_fewer_than_five_jobs(tmp_path: Path) -> None:
    """The create, the claim with the start, the first text, the end: before this
    change five (the claim and the start apart, the first text never joined to the
    end) and every idle worker's claim twice a second besides."""
    data = tmp_path / "data"
    with served(data, env=QUIET) as server, server.client() as http:
        finish(http, http.post("/v1/responses", json=BODY).json()["id"])  # the model loaded
        before = jobs(http)
        ids = []
        for _ in range(5):
            created = http.post("/v1/responses", json=BODY)
            assert created.status_code == 202, created.text
            ids.append(created.json()["id"])
            assert finish(http, ids[-1])["status"] == "completed"
        spent = jobs(http) - before
        print(f"writer jobs for 5 creates: {spent}")
        # four a create (a worker that looked as another claimed may add an empty
        # claim now and then); before, never fewer than five a create
        assert spent < 5 * 5, spent
        for response_id in ids:
            events = http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
            kinds = re.findall(r"^event: (\S+)$", events.text, re.M)
            assert kinds[:4] == [
                "response.created",
                "response.queued",
                "response.in_progress",
                "response.output_item.added",
            ], kinds
            assert kinds[-1] == "response.completed"
    conn = open_db(data)
    try:
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
        for (task_id,) in conn.execute("SELECT id FROM tasks"):
            kinds = [e["type"] for e in task_log(conn, task_id)]
            assert kinds[2:4] == ["response.loading", "response.in_progress"], kinds
    finally:
        conn.close()


def lone_transactions(http: httpx.Client) -> tuple[int, int]:
    """The writer's transactions so far, and those that held one job only."""
    text = http.get("/metrics").text
    total = re.search(r"^lmsp_write_jobs_per_transaction_count ([0-9.e+]+)$", text, re.M)
    lone = re.search(
        r'^lmsp_write_jobs_per_transaction_bucket\{le="1.0"\} ([0-9.e+]+)$', text, re.M
    )
    assert total is not None and lone is not None
    return int(float(total.group(1))), int(float(lone.group(1)))


def test_a_create_carries_a_waiting_workers_claim_in_its_own_commit(tmp_path: Path) -> None:
    """A create that finds a worker waiting commits that worker's claim with the
    response and its task: one transaction of two jobs, not a transaction for the create
    and then another, after the worker woke, for its claim. Each of these creates finds
    the workers waiting (the one before it finished, and a moment passed), so each adds
    a transaction of more than one job; before this change they added none (the runner's
    first text is joined to its end, and nothing else writes)."""
    data = tmp_path / "data"
    creates = 5
    with served(data, env=QUIET) as server, server.client() as http:
        finish(http, http.post("/v1/responses", json=BODY).json()["id"])  # the model loaded
        time.sleep(0.3)  # its worker back to waiting
        total_before, lone_before = lone_transactions(http)
        for _ in range(creates):
            created = http.post("/v1/responses", json=BODY)
            assert created.status_code == 202, created.text
            assert finish(http, created.json()["id"])["status"] == "completed"
            time.sleep(0.3)
        total, lone = lone_transactions(http)
        grouped = (total - total_before) - (lone - lone_before)
        print(f"{creates} creates: {total - total_before} transactions, {grouped} of them grouped")
        assert grouped >= creates
    conn = open_db(data)
    try:
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
        for (task_id,) in conn.execute("SELECT id FROM tasks"):
            kinds = [e["type"] for e in task_log(conn, task_id)]
            assert kinds[:4] == [
                "response.created",
                "response.queued",
                "response.loading",
                "response.in_progress",
            ], kinds
            assert kinds[-1] == "response.completed"
    finally:
        conn.close()


def test_an_idle_service_gives_the_writer_nothing(tmp_path: Path) -> None:
    """Idle workers look for a task every half second: with a read, not a claim's write
    transaction each (before: two writer jobs a second a worker, and the downloader's)."""
    with served(tmp_path / "data", env=QUIET) as server, server.client() as http:
        finish(http, http.post("/v1/responses", json=BODY).json()["id"])
        before = jobs(http)
        time.sleep(2.5)  # five looks of each worker
        assert jobs(http) - before == 0


def test_a_batch_the_writer_has_not_begun_joins_the_end(svc: Service) -> None:
    """The writer holds still after the task's start: its first text, handed to the
    writer at once, is still waiting when the task ends, so the end takes it back and
    writes it — one job, the same events (before: two)."""
    task_id = enqueue(svc)
    svc.runner.flush_interval = 3600.0  # the first text at once, the rest with the end
    gate, held = threading.Event(), threading.Event()

    def hold() -> None:  # in the writer thread, after each commit
        if not held.is_set() and status(svc, task_id) is Status.RUNNING:
            held.set()
            gate.wait()

    svc.db.on_commit(hold)
    runner = threading.Thread(target=svc.runner.run_next)
    runner.start()
    try:
        assert held.wait(120)
        # the attempt ended: the end's write waits behind the first text's (before this
        # change the end waited for the first text's commit: never two, the bound ends it)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and svc.db._queue.qsize() < 2:
            time.sleep(0.01)
        jobs_before = svc.db.jobs
    finally:
        gate.set()
    runner.join(120)
    assert status(svc, task_id) is Status.COMPLETED
    assert svc.db.jobs - jobs_before == 1
    conn = svc.db.reader()
    check_log_invariants(conn)  # type: ignore[arg-type]
    log = task_log(conn, task_id)  # type: ignore[arg-type]
    text = "".join(e["delta"] for e in log if e["type"] == "response.output_text.delta")
    task = task_store.get(conn, task_id)
    assert task is not None
    response = svc.response_object(task_id)
    assert text == response["output"][0]["content"][0]["text"] != ""
