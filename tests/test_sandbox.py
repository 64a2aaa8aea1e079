"""The sandbox: untrusted-input jobs in worker processes, stopped at their CPU, memory
and wall-clock limits, a worker replaced when it had to be killed, nothing printed."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp.sandbox import Overrun, Sandbox, WorkerFailed
from tests import sandbox_jobs as jobs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    # the workers import the jobs of tests/sandbox_jobs.py by reference
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    box = Sandbox(1, memory_bytes=256 << 20)
    yield box
    box.close()


def test_a_job_runs_in_another_process_and_answers(sandbox: Sandbox) -> None:
    assert sandbox.call(jobs.echo, {"a": [1, 2]}, cpu_seconds=5) == {"a": [1, 2]}
    worker = sandbox.call(jobs.pid, cpu_seconds=5)
    assert worker != os.getpid() and sandbox.pids() == [worker]
    assert sandbox.call(jobs.pid, cpu_seconds=5) == worker  # kept for the next job


def test_a_job_past_its_cpu_budget_is_stopped_and_the_worker_goes_on(sandbox: Sandbox) -> None:
    worker = sandbox.call(jobs.pid, cpu_seconds=5)
    with pytest.raises(Overrun) as caught:
        sandbox.call(jobs.spin, cpu_seconds=0.3)
    assert caught.value.limit == "cpu"
    assert sandbox.call(jobs.pid, cpu_seconds=5) == worker  # Python code: interrupted
    assert sandbox.overruns == {"cpu": 1}


def test_a_job_past_its_memory_is_stopped(sandbox: Sandbox) -> None:
    with pytest.raises(Overrun) as caught:
        sandbox.call(jobs.allocate, 1024, cpu_seconds=5)
    assert caught.value.limit == "memory"
    assert sandbox.call(jobs.allocate, 16, cpu_seconds=5) == 16 << 20


def test_a_job_that_does_not_answer_is_killed_and_its_worker_replaced(sandbox: Sandbox) -> None:
    worker = sandbox.call(jobs.pid, cpu_seconds=5)
    with pytest.raises(Overrun) as caught:
        sandbox.call(jobs.sleep, 60, cpu_seconds=0.1)  # wall limit: 5 x 0.1 + 1 s
    assert caught.value.limit == "wall"
    assert worker not in sandbox.pids()
    assert sandbox.call(jobs.pid, cpu_seconds=5) != worker


def test_a_worker_that_dies_is_a_crash_and_is_replaced(sandbox: Sandbox) -> None:
    with pytest.raises(Overrun) as caught:
        sandbox.call(jobs.die, cpu_seconds=5)
    assert caught.value.limit == "crash"
    assert sandbox.call(jobs.echo, "again", cpu_seconds=5) == "again"


def test_an_exception_comes_back_as_text(sandbox: Sandbox) -> None:
    with pytest.raises(WorkerFailed) as caught:
        sandbox.call(jobs.fail, cpu_seconds=5)
    assert caught.value.detail == "ValueError: a parser gave up"


def test_a_worker_prints_nothing(sandbox: Sandbox, capfd: pytest.CaptureFixture[str]) -> None:
    assert sandbox.call(jobs.shout, 1000, cpu_seconds=5) == 1000
    assert "noise" not in capfd.readouterr().err


def test_the_event_loop_goes_on_while_a_job_runs(sandbox: Sandbox) -> None:
    async def main() -> tuple[int, str]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            woke = await sandbox.run(jobs.sleep, 0.5, cpu_seconds=5)
        finally:
            ticker.cancel()
        return ticks, woke

    ticks, woke = asyncio.run(main())
    assert woke == "woke" and ticks >= 10
