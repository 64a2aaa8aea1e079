"""The real ``lmsp serve`` process: disconnects, graceful stop, first start."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, open_db

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    srv = Server(tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.05"}).start()
    yield srv
    srv.stop()


def wait_for(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_first_start_creates_owner_token_file(server: Server) -> None:
    token_file = server.data_dir / "owner.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert token.startswith("lmsp_") and len(token) >= 5 + 22
    conn = open_db(server.data_dir)
    stored = conn.execute("SELECT token_hash, token_prefix, scopes FROM clients").fetchall()
    assert len(stored) == 1 and stored[0]["scopes"] == '["admin"]'
    assert token not in stored[0]["token_hash"]
    service = httpx.get(f"{server.url}/v1/service").json()
    server.restart()
    assert httpx.get(f"{server.url}/v1/service").json()["id"] == service["id"]
    assert (server.data_dir / "owner.token").read_text().strip() == token


def test_a_streaming_client_that_leaves_cancels_its_task(server: Server) -> None:
    with server.client() as client:
        body = {"model": "lmsp-test", "input": "hi", "stream": True}
        with client.stream("POST", "/v1/responses", json=body) as stream:
            lines = stream.iter_lines()
            task_id = None
            for line in lines:
                if line.startswith("data:") and '"response.in_progress"' in line:
                    task_id = line.split('"task":{"id":"', 1)[1].split('"', 1)[0]
                    break
        assert task_id is not None

        def cancelled() -> bool:
            return bool(client.get(f"/v1/tasks/{task_id}").json()["status"] == "cancelled")

        wait_for(cancelled)


def test_a_background_stream_that_leaves_does_not_cancel(server: Server) -> None:
    with server.client() as client:
        body = {"model": "lmsp-test", "input": "hi", "stream": True, "background": True}
        with client.stream("POST", "/v1/responses", json=body) as stream:
            for line in stream.iter_lines():
                if '"response.output_text.delta"' in line:
                    break
        tasks = client.get("/v1/tasks").json()["data"]

        def done() -> bool:
            return bool(client.get(f"/v1/tasks/{tasks[0]['id']}").json()["status"] == "completed")

        wait_for(done)


def test_sigterm_leaves_running_tasks_to_recovery(server: Server) -> None:
    with server.client() as client:
        created = client.post(
            "/v1/responses",
            json={"model": "lmsp-test", "input": "go", "background": True, "on_restart": "resume"},
        ).json()

        def running() -> bool:
            task = client.get(f"/v1/tasks/{created['task']['id']}").json()
            return bool(task["status"] == "running" and task["last_sequence_number"] > 6)

        wait_for(running)
    server.stop()  # SIGTERM: a graceful stop
    conn = open_db(server.data_dir)
    row = conn.execute("SELECT status, snapshot FROM tasks").fetchone()
    assert row["status"] == "running" and row["snapshot"]
    server.start()
    with server.client() as client:

        def finished() -> bool:
            return bool(
                client.get(f"/v1/responses/{created['id']}").json()["status"] == "completed"
            )

        wait_for(finished)
        events = client.get(
            f"/v1/tasks/{created['task']['id']}/events", headers={"Accept": "application/json"}
        ).json()["data"]
    assert [e.get("resumed") for e in events if e["type"] == "response.in_progress"] == [None, True]
    check_log_invariants(open_db(server.data_dir))


def test_bad_configuration_is_one_clear_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = dict(os.environ, LMSP_DATA_DIR=str(tmp_path), LMSP_DEFAULT_ON_RESTART="maybe")
    result = subprocess.run(
        [sys.executable, "-m", "lmsp", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "LMSP_DEFAULT_ON_RESTART" in result.stderr
    assert "Traceback" not in result.stderr


def test_keep_alive_pings_do_not_break_sse_clients(tmp_path: Path) -> None:
    """Pings between events (here every 20 ms) must not look like events to the
    openai SDK, which keeps the last event id and would parse an empty event."""
    from openai import OpenAI

    srv = Server(
        tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.05", "LMSP_SSE_PING": "0.02"}
    ).start()
    try:
        sdk = OpenAI(base_url=f"{srv.url}/v1", api_key=srv.token, max_retries=0)
        events = list(sdk.responses.create(model="lmsp-test", input="hi", stream=True))
        seqs = [e.sequence_number for e in events]
        assert seqs == sorted(set(seqs)) and seqs[0] == 0  # the log's numbers, in order
        assert events[-1].type == "response.completed"
        again = list(sdk.responses.retrieve(events[-1].response.id, stream=True))
        assert [e.sequence_number for e in again] == [e.sequence_number for e in events]
        with httpx.stream(
            "GET",
            f"{srv.url}/v1/responses/{events[-1].response.id}",
            params={"stream": "true"},
            headers={"Authorization": f"Bearer {srv.token}"},
        ) as raw:
            assert raw.status_code == 200
            raw.read()
    finally:
        srv.stop()
