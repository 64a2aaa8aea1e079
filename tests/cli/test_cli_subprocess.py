"""``lmsp`` as a real subprocess against a real server: every command once, and
``tasks follow`` (with the Python clients beside it) surviving ``kill -9`` + restart."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import lmsp
from tests.helpers import Server, seeded_data_dir

pytestmark = pytest.mark.slow


def cli_env(server: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LMSP_TOKEN"}
    env.update({"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir)})
    return env


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmsp", *args],
        env=cli_env(server),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("sub") / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.01"}).start()
    yield srv
    srv.stop()


def test_every_command_as_a_subprocess(server: Server) -> None:
    def ok(*args: str) -> str:
        done = cli(server, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
        return done.stdout

    assert ok("run", "hello", "-m", "lmsp-test").strip()
    queued = json.loads(ok("run", "bg", "-m", "lmsp-test", "--background", "--json"))
    task_id = queued["task"]["id"]
    assert ok("tasks", "follow", task_id).strip()
    assert task_id in ok("tasks", "ls")
    assert json.loads(ok("tasks", "show", task_id, "--json"))["task"]["status"] == "completed"
    assert task_id in ok("tasks", "cancel", task_id)
    agent = httpx.post(f"{server.url}/v1/pairing", json={"client_name": "sub"}).json()
    other = httpx.post(f"{server.url}/v1/pairing", json={"client_name": "sub2"}).json()
    assert agent["user_code"] in ok("pair", "ls")
    assert "approved" in ok("pair", "approve", agent["user_code"])
    assert "denied" in ok("pair", "deny", other["user_code"])
    token = ok("clients", "add", "sub-bot", "--scopes", "models:read").strip()
    bot = next(c for c in json.loads(ok("clients", "ls", "--json")) if c["name"] == "sub-bot")
    assert bot["token_prefix"] == token[:11]
    assert "revoked" in ok("clients", "revoke", bot["id"])
    assert json.loads(ok("doctor", "--json"))["ok"] is True
    held = cli(server, "gc")  # the running server owns the directory (it sweeps by itself)
    assert held.returncode == 1 and held.stdout == ""
    assert held.stderr.count("\n") == 1 and "in use by another lmsp process (pid" in held.stderr
    down = subprocess.run(
        [sys.executable, "-m", "lmsp", "tasks", "ls"],
        env=dict(cli_env(server), LMSP_URL="http://127.0.0.1:9"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 1 and down.stdout == ""
    # the directory's server runs, elsewhere: where, not "start one" (that would fail)
    assert server.proc is not None
    hint = f"the service of {server.data_dir} (pid {server.proc.pid}) serves on {server.url}"
    assert down.stderr.strip() == (
        f"Error: cannot reach lmsp at http://127.0.0.1:9: {hint} (unreachable)"
    )


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def test_follow_and_the_clients_survive_a_server_restart(tmp_path: Path, blob_cache: Path) -> None:
    server = Server(
        seeded_data_dir(tmp_path / "data", blob_cache), env={"LMSP_TEST_ENGINE_DELAY": "0.1"}
    ).start()
    try:
        with lmsp.Client(server.url, server.token) as api:
            created = api.create(
                model="lmsp-test", input="survive", background=True, on_restart="resume"
            )
        task_id = created["task"]["id"]
        follow = subprocess.Popen(
            [sys.executable, "-m", "lmsp", "tasks", "follow", task_id],
            env=cli_env(server),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        synced: list[dict[str, Any]] = []
        streamed: list[dict[str, Any]] = []

        def sync_stream() -> None:
            with lmsp.Client(server.url, server.token) as api:
                synced.extend(api.stream(created["id"]))

        async def async_stream() -> None:
            async with lmsp.AsyncClient(server.url, server.token) as api:
                streamed.extend([e async for e in api.stream(created["id"])])

        threads = [
            threading.Thread(target=sync_stream),
            threading.Thread(target=lambda: asyncio.run(async_stream())),
        ]
        for thread in threads:
            thread.start()
        assert follow.stdout is not None
        first = os.read(follow.stdout.fileno(), 1)  # unbuffered: follow is printing
        deadline = time.monotonic() + 30
        while len(synced) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()
        server.start()
        rest, err = follow.communicate(timeout=120)
        for thread in threads:
            thread.join(120)
        assert follow.returncode == 0, err.decode()
        with lmsp.Client(server.url, server.token) as api:
            final = api.retrieve(created["id"])
        text = final["output"][0]["content"][0]["text"]
        assert final["status"] == "completed"
        assert (first + rest).decode() == text + "\n"
        assert "resumes where it stopped" in err.decode()
        for events in (synced, streamed):
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[-1]["type"] == "response.completed"
            assert text_of(events) == text
            assert [e.get("resumed") for e in events if e["type"] == "response.in_progress"] == [
                None,
                True,
            ]
    finally:
        server.stop()
