"""An engine outlives a crash of the API process (``LMSP_ENGINE_ORPHAN_TIMEOUT``), through
the real server (``lmsp serve``):

- ``kill -9`` of the API process while a task generates (the real model, exact mode): the
  relaunched service reattaches to the same engine process, and the task resumes to the
  text of an uninterrupted run;
- a lease copied from another data directory names a living engine that does not know
  this directory's key: it is not reattached (a new engine serves); a lease naming a dead
  process is not either;
- an orphaned engine nobody reattaches to exits by itself after its timeout;
- a normal stop ends the engine (and its lease); an engine reattached and then killed is
  restarted by the supervisor as any other.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, exited, finish, open_db, wait_exited
from tests.test_resume import text_of

MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"

pytestmark = pytest.mark.slow


def engine_pid(http: httpx.Client, model: str) -> int:
    deadline = time.monotonic() + 120
    while True:
        found = [e for e in http.get("/healthz").json()["engines"] if e["model"] == model]
        if found and found[0].get("state") == "ready" and found[0].get("pid"):
            return int(found[0]["pid"])
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def leases(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "engines").glob("*.json"))


def served_once(server: Server) -> int:
    """A test-engine response completed; its engine's pid."""
    with server.client() as http:
        made = http.post(
            "/v1/responses", json={"model": TEST_MODEL, "input": "hi", "background": True}
        ).json()
        assert finish(http, made["id"])["status"] in ("completed", "incomplete")
        return engine_pid(http, TEST_MODEL)


#: a greedy task on the real model that runs to its token limit, resumed after a crash
JOB = {
    "model": MODEL,
    "input": "Write a long story about a lighthouse keeper.",
    "temperature": 0,
    "max_output_tokens": 96,
    "background": True,
    "on_restart": "resume",
}


def uninterrupted(http: httpx.Client) -> dict[str, Any]:
    """:data:`JOB` run whole (the text a resumed run must end with, in exact mode)."""
    whole = finish(http, http.post("/v1/responses", json=JOB).json()["id"])
    assert whole["status"] == "incomplete", whole  # it runs to its token limit
    return whole


def under_way(http: httpx.Client) -> str:
    """The id of :data:`JOB` created again, once it has written text."""
    made = http.post("/v1/responses", json=JOB).json()
    while not text_of(http.get(f"/v1/responses/{made['id']}").json()):
        time.sleep(0.02)
    return str(made["id"])


def test_kill_9_of_the_api_reattaches_to_the_same_engine(tmp_path: Path) -> None:
    env = {"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s", "LMSP_EXACT": "1", "LMSP_PARALLEL": "2"}
    server = Server(tmp_path / "data", env=env).start()
    try:
        with server.client() as http:
            whole = uninterrupted(http)
            made = {"id": under_way(http)}
            pid = engine_pid(http, MODEL)
        server.kill()  # kill -9 of the API process, the task half done
        with open_db(server.data_dir) as conn:
            status = conn.execute(
                "SELECT status FROM tasks WHERE response_id = ?", (made["id"],)
            ).fetchone()[0]
        assert status == "running"  # it was cut off mid-generation
        assert not exited(pid), "the engine died with the API process"
        server.start()
        with server.client() as http:
            resumed = finish(http, made["id"])
            assert engine_pid(http, MODEL) == pid  # the same process: reattached
        assert resumed["status"] == "incomplete", resumed
        assert text_of(resumed) == text_of(whole)  # exact mode: as if never interrupted
        check_log_invariants(open_db(server.data_dir))
        assert "reattached to the engine of smollm2-135m-instruct" in server.log_path.read_text()
    finally:
        server.stop()
    assert wait_exited(pid, 30), "a stopped service left its engine running"
    assert leases(server.data_dir) == []


def test_a_foreign_or_stale_lease_is_not_reattached(tmp_path: Path) -> None:
    env = {"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s"}
    other = Server(tmp_path / "other", env=env).start()
    server = Server(tmp_path / "data", env=env).start()
    foreign = 0
    try:
        foreign = served_once(other)
        other.kill()  # its engine waits for the other service to come back
        mine = served_once(server)
        server.kill()
        (found,) = leases(other.data_dir)
        (lease,) = leases(server.data_dir)
        os.kill(mine, signal.SIGKILL)
        assert wait_exited(mine)
        shutil.copy(found, lease)  # this directory's lease now names the other's engine

        server.start()
        pid = served_once(server)
        assert pid != foreign and not exited(foreign)  # it never proved this directory's key
        said = server.log_path.read_text()
        assert f"the engine left for {TEST_MODEL} (pid {foreign}) was not reattached" in said
        server.kill()
        os.kill(pid, signal.SIGKILL)  # a lease naming a dead process: stale
        assert wait_exited(pid)
        server.start()
        again = served_once(server)
        assert again not in (pid, foreign)
    finally:
        server.stop()
        other.stop()
        if foreign and not exited(foreign):
            os.kill(foreign, signal.SIGKILL)


def test_an_orphaned_engine_exits_by_itself(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"LMSP_ENGINE_ORPHAN_TIMEOUT": "2s"}).start()
    try:
        pid = served_once(server)
        server.kill()
        assert wait_exited(pid, 60), "an orphaned engine outlived its timeout"
        assert "no service reattached within 2 s; exiting" in server.log_path.read_text()
    finally:
        server.stop()


def test_a_reattached_engine_is_supervised_and_stopped_as_any(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s"}).start()
    try:
        pid = served_once(server)
        server.kill()
        server.start()
        assert served_once(server) == pid  # reattached
        os.kill(pid, signal.SIGKILL)  # the engine itself crashes: today's path
        assert wait_exited(pid)
        with server.client() as http:
            deadline = time.monotonic() + 120
            while (now := engine_pid(http, TEST_MODEL)) == pid:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert served_once(server) == now  # restarted by the supervisor
        server.stop()  # a normal stop ends it, and its lease
        assert wait_exited(now, 30), "a stopped service left its engine running"
        assert leases(server.data_dir) == []
    finally:
        server.stop()


def test_an_engine_of_other_settings_is_stopped_not_reattached(tmp_path: Path) -> None:
    env = {"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s", "LMSP_PARALLEL": "2"}
    server = Server(tmp_path / "data", env=env).start()
    try:
        pid = served_once(server)
        server.kill()
        server.extra_env["LMSP_PARALLEL"] = "3"  # the engine no longer fits
        server.start()
        assert served_once(server) != pid
        assert wait_exited(pid, 30), "the engine that no longer fits was left running"
        assert f"the engine left for {TEST_MODEL} (pid {pid}) does not fit" in (
            server.log_path.read_text()
        )
    finally:
        server.stop()
