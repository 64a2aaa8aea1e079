"""``kill -9`` during batched generation: several real-model tasks share one context
(``LMSP_PARALLEL=3``) when the server is killed, twice. Every task then follows its
``on_restart`` policy; each resumed text equals its uninterrupted run, a retried task
starts over and gives the same text, a ``fail`` task fails, and every log is gap-free."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server, check_log_invariants, open_db, task_log
from tests.test_resume import kill_mid_task, text_of

MODEL = "smollm2-135m-instruct"
JOBS: list[dict[str, Any]] = [
    {"input": "Write a story about a lighthouse.", "temperature": 0, "on_restart": "resume"},
    {
        "input": "Describe a storm at sea.",
        "temperature": 0.8,
        "seed": 99,
        "on_restart": "resume",
    },
    {"input": "Explain how tides work.", "temperature": 0, "on_restart": "retry"},
    {"input": "List ten sea birds.", "temperature": 0, "on_restart": "fail"},
]


def body(job: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 160, **job}


def statuses(data_dir: Path, ids: list[str]) -> dict[str, tuple[str, int]]:
    conn = open_db(data_dir)
    try:
        rows = conn.execute(
            f"SELECT id, status, last_sequence_number FROM tasks WHERE id IN "
            f"({','.join('?' * len(ids))})",
            ids,
        ).fetchall()
        return {r["id"]: (r["status"], r["last_sequence_number"]) for r in rows}
    finally:
        conn.close()


def wait_running(data_dir: Path, ids: list[str], beyond: dict[str, int]) -> dict[str, int]:
    """Until every unfinished task of ``ids`` runs with events past ``beyond``."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = statuses(data_dir, ids)
        live = {i: s for i, s in now.items() if s[0] in ("queued", "loading", "running")}
        if live and all(s[0] == "running" and s[1] > beyond.get(i, 2) for i, s in live.items()):
            return {i: s[1] for i, s in now.items()}
        if not live:
            return {i: s[1] for i, s in now.items()}
        time.sleep(0.01)
    raise AssertionError(f"no progress: {statuses(data_dir, ids)}")


@pytest.mark.slow
def test_kill_9_during_batched_generation(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, env={"LMSP_PARALLEL": "3", "LMSP_EXACT": "1"}).start()
    try:
        with server.client(timeout=300) as http:
            references = [
                http.post("/v1/responses", json=body(job)).json() for job in JOBS
            ]  # one at a time: each alone in the batch
            created = [
                http.post("/v1/responses", json={**body(job), "background": True}).json()
                for job in JOBS
            ]
        ids = [c["task"]["id"] for c in created[:3]]  # the fourth waits for a sequence
        marks = wait_running(data_dir, ids, {})
        interrupted = 0  # kills that found the first task unfinished: each is a resume
        for _ in range(2):
            interrupted += kill_mid_task(server, data_dir, ids[0])
            server.start()
            marks = wait_running(data_dir, ids, {i: m + 5 for i, m in marks.items()})

        finals = []
        with server.client(timeout=300) as http:
            for made in created:
                deadline = time.monotonic() + 300
                while (final := http.get(f"/v1/responses/{made['id']}").json())["status"] in (
                    "queued",
                    "in_progress",
                ):
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                finals.append(final)
        for job, reference, final in zip(JOBS, references, finals, strict=True):
            if job["on_restart"] == "fail":  # queued behind the others at the first kill
                assert final["status"] == "failed"
                assert final["error"]["code"] == "server_restarted"
                continue
            assert final["status"] == reference["status"], job
            assert text_of(final) == text_of(reference), job
            assert final["usage"]["output_tokens"] == reference["usage"]["output_tokens"]
        assert finals[0]["status"] != "failed" and finals[1]["status"] != "failed"

        conn = open_db(data_dir)
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
        for made, final in zip(created, finals, strict=True):
            events = task_log(conn, made["task"]["id"])
            starts = [
                i
                for i, e in enumerate(events)
                if e["type"] == "response.in_progress" and not e.get("resumed")
            ]
            last_attempt = events[starts[-1] :] if starts else events  # a retry starts over
            deltas = "".join(
                e["delta"] for e in last_attempt if e["type"] == "response.output_text.delta"
            )
            if final["status"] != "failed":
                assert deltas == text_of(final)  # every crash joined: nothing lost or repeated
        resumed = [
            e
            for e in task_log(conn, created[0]["task"]["id"])
            if e["type"] == "response.in_progress" and e.get("resumed")
        ]
        conn.close()
        assert interrupted >= 1 and len(resumed) == interrupted
    finally:
        server.stop()
