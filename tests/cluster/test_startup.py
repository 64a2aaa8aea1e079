"""The head start of ``lmsp serve`` (cluster/startup.py): after a crash, the data directory
is recovered and the engines of the tasks recovery left unfinished are launched before
the HTTP application is imported, so their loading overlaps the rest of the start; the
application then takes the opened directory over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import Server, seeded_data_dir

PROBE = """
import json, sys, time
from lmsp import config
from lmsp.cluster.startup import head_start

head = head_start(config.from_env())
http_loaded = sorted(m for m in ("fastapi", "uvicorn", "starlette") if m in sys.modules)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    states = {s["model"]: s["state"] for s in head.host.engine_status()}
    if states.get("lmsp-test") == "ready":
        break
    time.sleep(0.05)
print(json.dumps({
    "http": http_loaded,
    "states": states,
    "loaded": sorted(head.host.loaded_ids()),
    "failed": len(head.report.failed),
}))
head.close()
"""


def crashed_with_a_task(tmp_path: Path, blob_cache: Path, on_restart: str) -> tuple[Path, str]:
    """A data directory whose server was killed while a task of the test model ran."""
    data = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data, env={"LMSP_TEST_ENGINE_DELAY": "0.5"}).start()
    with server.client() as http:
        created = http.post(
            "/v1/responses",
            json={
                "model": "lmsp-test",
                "input": "left running",
                "background": True,
                "on_restart": on_restart,
            },
        )
        assert created.status_code == 202, created.text
    server.kill()  # the task is left unfinished
    return data, str(created.json()["task"]["id"])


def probe(data: Path, script: str = PROBE) -> dict[str, object]:
    env = dict(os.environ, LMSP_DATA_DIR=str(data), LMSP_ENABLE_TEST_ENGINE="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_the_engines_of_unfinished_tasks_start_before_the_http_application(
    tmp_path: Path, blob_cache: Path
) -> None:
    data, task_id = crashed_with_a_task(tmp_path, blob_cache, "retry")
    seen = probe(data)
    assert seen["http"] == []  # the HTTP stack is not imported yet
    assert seen["states"] == {"lmsp-test": "ready"} and seen["loaded"] == ["lmsp-test"]
    assert seen["failed"] == 0  # recovered (requeued) before the engine was launched
    restarted = Server(data).start()  # the application takes an opened directory over
    try:
        with restarted.client() as http:
            task = http.get(f"/v1/tasks/{task_id}").json()
        assert task["status"] in ("queued", "running", "completed")
    finally:
        restarted.stop()


def test_tasks_recovery_fails_launch_no_engine(tmp_path: Path, blob_cache: Path) -> None:
    """``on_restart: fail`` (the default): the interrupted task is failed by recovery, so
    nothing will run on the model and no engine takes the start's CPU and memory."""
    data, _ = crashed_with_a_task(tmp_path, blob_cache, "fail")
    seen = probe(data, PROBE.replace("time.monotonic() + 60", "time.monotonic() + 1"))
    assert seen == {"http": [], "states": {}, "loaded": [], "failed": 1}


def test_a_start_with_nothing_unfinished_launches_no_engine(tmp_path: Path) -> None:
    seen = probe(
        tmp_path / "data", PROBE.replace("time.monotonic() + 60", "time.monotonic() + 0.5")
    )
    assert seen == {"http": [], "states": {}, "loaded": [], "failed": 0}
