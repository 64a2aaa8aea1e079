"""An engine process started ahead, through the real server (``lmsp serve``,
engines/ahead.py): once a model's engine is up, one more process waits with the engine's
imports done, at the engine's priority; after ``kill -9`` of the engine, the new engine
is that process, every thread of it at that priority, and a task continues on it; a
graceful stop and ``kill -9`` of the service each end it too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers import Server, children, finish, wait_exited
from tests.test_engine_crash import TEST_MODEL, engine, wait_engine
from tests.test_engine_nice import niceness


def spawned(pid: int) -> set[int]:
    """``pid``'s children that are multiprocessing's spawned processes (its engines and
    the one started ahead; not multiprocessing's resource tracker)."""
    found = set()
    for child in children(pid):
        try:
            line = Path(f"/proc/{child}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"spawn_main" in line:
            found.add(child)
    return found


def started_ahead(server: Server, engine_pid: int, timeout: float = 60) -> int:
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while True:
        others = spawned(server.proc.pid) - {engine_pid}
        if others:
            assert len(others) == 1, others
            return others.pop()
        assert time.monotonic() < deadline, "no engine process was started ahead"
        time.sleep(0.05)


def body(text: str) -> dict[str, object]:
    return {"model": TEST_MODEL, "input": text, "background": True, "on_restart": "resume"}


def test_the_engine_after_a_crash_is_the_process_started_ahead(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.05"}).start()
    assert server.proc is not None
    try:
        with server.client() as http:
            finish(http, http.post("/v1/responses", json=body("warm up")).json()["id"])
            first = engine(http, TEST_MODEL)["pid"]
            waiting = started_ahead(server, first)

            running = http.post("/v1/responses", json=body("slow " * 30)).json()
            os.kill(first, 9)
            assert wait_exited(first, 30)
            ready = wait_engine(http, TEST_MODEL, state="ready", restarts=1)
            assert ready["pid"] == waiting  # it became the engine: no new interpreter
            api = os.getpriority(os.PRIO_PROCESS, server.proc.pid)
            threads = niceness(waiting)
            assert set(threads.values()) == {min(19, api + 10)}, threads  # LMSP_ENGINE_NICE
            done = finish(http, running["id"])
            assert done["status"] == "completed", done
            follower = started_ahead(server, waiting)  # and another waits in turn
        server.stop()
        for pid in (waiting, follower):
            assert wait_exited(pid, 30), f"process {pid} outlived its service"
    finally:
        server.stop()


def test_kill_9_of_the_service_ends_the_process_started_ahead(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        with server.client() as http:
            finish(http, http.post("/v1/responses", json=body("warm up")).json()["id"])
            waiting = started_ahead(server, engine(http, TEST_MODEL)["pid"])
        server.kill()
        assert wait_exited(waiting, 30), "the process started ahead outlived its service"
    finally:
        server.stop()
