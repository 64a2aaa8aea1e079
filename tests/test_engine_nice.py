"""``LMSP_ENGINE_NICE`` (default 10): a local model's engine process runs below the API
process's scheduling priority, so its llama.cpp threads, which would take both cores,
give way to the API's threads when a request, a stream or ``/healthz`` needs one; a
remote model's engine only relays its upstream's tokens and keeps the API's priority.
Through a real ``lmsp serve``, the bundled model and a real ``llama-server`` upstream;
each thread's niceness read from ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests import remote_fixtures
from tests.helpers import Server
from tests.remote_fixtures import add
from tests.test_engine_reattach import engine_pid
from tests.upstream import Upstream

LOCAL = "smollm2-135m-instruct"

# the fixtures: a real lmsp serve and a real llama-server upstream
lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream


def niceness(pid: int) -> dict[int, int]:
    """Each thread of process ``pid``: its niceness (``/proc/PID/task/TID/stat``)."""
    found: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(task.name)] = int(fields[16])  # the 19th field of the whole line
    return found


def answered(http: httpx.Client, model: str) -> None:
    body = {"model": model, "input": "Say hi.", "max_output_tokens": 4}
    done = http.post("/v1/responses", json=body, timeout=300)
    assert done.status_code == 200, done.text
    assert done.json()["status"] in ("completed", "incomplete"), done.text


def test_a_local_engine_runs_below_the_api_and_a_remote_one_beside_it(
    lmsp: Server, upstream: Upstream
) -> None:
    assert lmsp.proc is not None
    api = os.getpriority(os.PRIO_PROCESS, lmsp.proc.pid)
    with lmsp.client() as http:
        answered(http, LOCAL)
        threads = niceness(engine_pid(http, LOCAL))
        add(http, upstream)
        answered(http, remote_fixtures.MODEL)  # one model loaded at a time: it replaces it
        remote = niceness(engine_pid(http, remote_fixtures.MODEL))
    assert len(threads) > 1  # llama.cpp's threads as well as the engine's own
    assert set(threads.values()) == {min(19, api + 10)}, threads
    assert set(remote.values()) == {api}, remote
    assert set(niceness(lmsp.proc.pid).values()) == {api}  # the API's own threads


def test_engine_nice_zero_keeps_the_engine_on_a_par(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", env={"LMSP_ENGINE_NICE": "0"}).start()
    try:
        assert server.proc is not None
        with server.client() as http:
            answered(http, LOCAL)
            local = engine_pid(http, LOCAL)
        api = os.getpriority(os.PRIO_PROCESS, server.proc.pid)
        assert set(niceness(local).values()) == {api}
    finally:
        server.stop()
