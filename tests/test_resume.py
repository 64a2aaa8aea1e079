"""Faithful resume: ``kill -9`` a real-model task many times mid-generation; in exact
mode (``LMSP_EXACT=1``), with greedy decoding or a fixed seed its final text equals an
uninterrupted run's, and its event log joins across every crash with nothing lost and
nothing repeated. In the fast default a resumed task keeps every token it committed and
goes on from there: a valid continuation, not necessarily the uninterrupted text."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server, check_log_invariants, open_db, task_log

MODEL = "smollm2-135m-instruct"
BODY = {
    "model": MODEL,
    "input": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "max_output_tokens": 200,
    "on_restart": "resume",
}
KILLS = 6
STEP = 1  # new delta events (each a flush of several tokens) the resumed task must log first


def text_of(obj: dict[str, Any]) -> str:
    return "".join(c["text"] for item in obj["output"] for c in item["content"])


def logprobs_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [lp for item in obj["output"] for c in item["content"] for lp in c["logprobs"]]


def progress(data_dir: Path, task_id: str) -> tuple[str, int]:
    conn = open_db(data_dir)
    try:
        row = conn.execute(
            "SELECT status, last_sequence_number FROM tasks WHERE id = ?", (task_id,)
        ).fetchone()
        return str(row["status"]), int(row["last_sequence_number"])
    finally:
        conn.close()


def wait_for_events(data_dir: Path, task_id: str, beyond: int) -> tuple[str, int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, last = progress(data_dir, task_id)
        if last >= beyond or status in ("completed", "failed", "cancelled"):
            return status, last
        time.sleep(0.005)
    raise AssertionError(f"{task_id} made no progress past {beyond}")


def kill_mid_task(server: Server, data_dir: Path, task_id: str) -> bool:
    """``kill -9`` the server; whether the task was still unfinished when it died (it may
    end between the last read and the kill, and then there is nothing to resume)."""
    server.kill()  # mid-generation: no shutdown code runs
    status, _ = progress(data_dir, task_id)
    return status not in ("completed", "failed", "cancelled")


def finished(server: Server, response_id: str) -> dict[str, Any]:
    """The response once it has ended (the server resumes it meanwhile)."""
    with server.client(timeout=300) as http:
        deadline = time.monotonic() + 300
        while (final := http.get(f"/v1/responses/{response_id}").json())["status"] in (
            "queued",
            "in_progress",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    result: dict[str, Any] = final
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0},
        {"temperature": 0.8, "seed": 20240611},
        {
            "temperature": 0.9,
            "seed": 7,
            "top_k": 40,
            "min_p": 0.02,
            "top_p": 0.95,
            "repeat_penalty": 1.15,
            "presence_penalty": 0.3,
            "frequency_penalty": 0.2,
            "top_logprobs": 2,
            "max_output_tokens": 120,  # fewer tokens: each step here does the most work
        },
    ],
    ids=["greedy", "seeded", "every-sampler"],
)
def test_kill_9_many_times_then_the_uninterrupted_text(
    tmp_path: Path, sampling: dict[str, Any]
) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, env={"LMSP_EXACT": "1"}).start()
    try:
        with server.client(timeout=300) as http:
            reference = http.post("/v1/responses", json={**BODY, **sampling}).json()
            created = http.post(
                "/v1/responses", json={**BODY, **sampling, "background": True}
            ).json()
        assert reference["status"] in ("completed", "incomplete")
        expected = text_of(reference)
        task_id = created["task"]["id"]

        kills = 0
        status, last = wait_for_events(data_dir, task_id, 5 + STEP)  # 4 opening events, then text
        while kills < KILLS and status == "running":
            kills += kill_mid_task(server, data_dir, task_id)
            server.start()
            status, last = wait_for_events(data_dir, task_id, last + 1 + STEP)
        assert kills == KILLS, f"the task finished after only {kills} kills"

        final = finished(server, created["id"])
        assert final["status"] == reference["status"]
        assert text_of(final) == expected
        for name in sampling.keys() - {"seed"}:  # the numbers it ran with, echoed
            assert final[name] == reference[name] == sampling[name]
        if sampling.get("top_logprobs"):  # the same log probabilities, crashes or not
            got, want = logprobs_of(final), logprobs_of(reference)
            assert [e["token"] for e in got] == [e["token"] for e in want] and got
            assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want])
        assert final["usage"] == reference["usage"]
        assert final["model_digest"] == reference["model_digest"]

        conn = open_db(data_dir)
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
        events = task_log(conn, task_id)
        conn.close()
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert deltas == expected  # every crash joined: nothing lost, nothing repeated
        resumed = [e for e in events if e["type"] == "response.in_progress" and e.get("resumed")]
        assert len(resumed) == KILLS
    finally:
        server.stop()


@pytest.mark.slow
def test_kill_9_in_fast_mode_keeps_every_committed_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, env={"LMSP_EXACT": "0"}).start()
    try:
        with server.client(timeout=300) as http:
            created = http.post("/v1/responses", json={**BODY, "background": True}).json()
        task_id = created["task"]["id"]
        committed: list[str] = []
        status, last = wait_for_events(data_dir, task_id, 5 + STEP)  # 4 opening events, then text
        for _ in range(2):
            if status != "running":
                break
            server.kill()
            conn = open_db(data_dir)
            events = task_log(conn, task_id)
            conn.close()
            committed.append(
                "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            )
            server.start()
            status, last = wait_for_events(data_dir, task_id, last + 1 + STEP)
        assert committed and committed[0]

        final = finished(server, created["id"])
        assert final["status"] in ("completed", "incomplete")
        text = text_of(final)
        for before in committed:  # what a client saw before a crash stays, in order
            assert text.startswith(before) and len(text) > len(before)
        conn = open_db(data_dir)
        check_log_invariants(conn)
        events = task_log(conn, task_id)
        conn.close()
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert deltas == text  # every crash joined: nothing lost, nothing repeated
        assert final["usage"]["output_tokens"] <= BODY["max_output_tokens"]
    finally:
        server.stop()
