"""A task's runner thread wakes for its batches, not for every token (issue 40).

The engine's reader thread keeps a sequence's steps until the runner's next batch is
due (``Stream.pace``); before, it woke the runner thread for every step of every
sequence. Counted with the kernel's own count of the times the runner thread gave up
its core (``voluntary_ctxt_switches``), not with times."""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path

import pytest

from lmsp.app.root import open_service
from lmsp.config import Settings
from lmsp.protocol.states import Status
from tests.helpers import check_log_invariants, task_log
from tests.runner.test_runner import enqueue, status

TOKENS = 300


def switches() -> int:
    """This thread's voluntary context switches so far."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)$", status, re.M)
    assert found is not None
    return int(found.group(1))


def test_a_runner_wakes_for_its_batches_not_for_every_token(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.01")  # a step every 10 ms: about 3 s
    monkeypatch.setenv("LMSP_TEST_ENGINE_LENGTH", str(TOKENS))
    svc = open_service(settings)
    try:
        svc.runner.flush_interval = 0.25
        enqueue(svc)
        svc.runner.run_next()  # the engine loaded
        task_id = enqueue(svc)
        woke: list[int] = []

        def run() -> None:
            before = switches()
            assert svc.runner.run_next() == task_id
            woke.append(switches() - before)

        runner = threading.Thread(target=run)
        runner.start()
        runner.join(120)
        assert status(svc, task_id) is Status.COMPLETED
        conn = svc.db.reader()
        check_log_invariants(conn)  # type: ignore[arg-type]
        log = task_log(conn, task_id)  # type: ignore[arg-type]
        deltas = [e["delta"] for e in log if e["type"] == "response.output_text.delta"]
    finally:
        svc.runner.stop()
        svc.host.close()
        svc.db.close()
    assert len("".join(deltas).split()) == TOKENS  # every word, once
    # the batches came as the engine went on (about 12 in 3 s), not all with the end
    assert len(deltas) >= 4, len(deltas)
    print(f"the runner thread woke {woke[0]} times for {TOKENS} tokens in {len(deltas)} batches")
    # a wake a batch (and its commit's answer), the first text's, the end's; before
    # this change at least one a token
    assert woke[0] < TOKENS // 3, woke


def test_the_batches_of_tasks_in_flight_share_commits(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every task's batches fall due on the ticks of one flush clock, so the batches of
    the tasks in flight reach the group-commit writer together: far fewer commits than
    batches (before, each task's batch came a flush interval after its own last one:
    51 and 70 commits for the same 120 jobs in two runs)."""
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.01")
    monkeypatch.setenv("LMSP_TEST_ENGINE_LENGTH", str(TOKENS))
    settings = dataclasses.replace(settings, parallel=8)
    svc = open_service(settings)
    try:
        svc.runner.flush_interval = 0.25
        enqueue(svc)
        svc.runner.run_next()  # the engine loaded
        ids = [enqueue(svc) for _ in range(8)]
        jobs, commits = svc.db.jobs, svc.db.commits
        runners = [threading.Thread(target=svc.runner.run_next, args=(i,)) for i in range(8)]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(120)
        jobs, commits = svc.db.jobs - jobs, svc.db.commits - commits
        assert all(status(svc, task_id) is Status.COMPLETED for task_id in ids)
    finally:
        svc.runner.stop()
        svc.host.close()
        svc.db.close()
    print(f"8 tasks of {TOKENS} tokens: {jobs} writer jobs in {commits} commits")
    assert jobs >= 8 * 10  # about 12 batches a task, and its claim and end
    assert commits * 3 < jobs, (jobs, commits)  # before: 51 and 70 commits for 120 jobs
