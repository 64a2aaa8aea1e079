"""The head start of ``lmsp serve`` (tasks/startup.py): after a crash, the engines of
unfinished tasks are launched before the HTTP application is imported, so their loading
overlaps the rest of the start; the application then takes the opened directory over."""

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
from lmsp.tasks.startup import head_start

head = head_start(config.from_env())
http_loaded = sorted(m for m in ("fastapi", "uvicorn", "starlette") if m in sys.modules)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    states = {s["model"]: s["state"] for s in head.host.engine_status()}
    if states.get("lmsp-test") == "ready":
        break
    time.sleep(0.05)
print(json.dumps({"http": http_loaded, "states": states, "loaded": sorted(head.host.loaded_ids())}))
head.close()
"""


def test_the_engines_of_unfinished_tasks_start_before_the_http_application(
    tmp_path: Path, blob_cache: Path
) -> None:
    data = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data, env={"LMSP_TEST_ENGINE_DELAY": "0.5"}).start()
    with server.client() as http:
        created = http.post(
            "/v1/responses",
            json={
                "model": "lmsp-test",
                "input": "left running",
                "background": True,
                "on_restart": "retry",
            },
        )
        assert created.status_code == 202, created.text
    server.kill()  # the task is left unfinished
    env = dict(os.environ, LMSP_DATA_DIR=str(data), LMSP_ENABLE_TEST_ENGINE="1")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["http"] == []  # the HTTP stack is not imported yet
    assert seen["states"] == {"lmsp-test": "ready"} and seen["loaded"] == ["lmsp-test"]
    restarted = Server(data).start()  # the application takes an opened directory over
    try:
        with restarted.client() as http:
            task = http.get(f"/v1/tasks/{created.json()['task']['id']}").json()
        assert task["status"] in ("queued", "running", "completed")
    finally:
        restarted.stop()


def test_a_start_with_nothing_unfinished_launches_no_engine(tmp_path: Path) -> None:
    env = dict(os.environ, LMSP_DATA_DIR=str(tmp_path / "data"), LMSP_ENABLE_TEST_ENGINE="1")
    probe = PROBE.replace("time.monotonic() + 60", "time.monotonic() + 0.5")
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"http": [], "states": {}, "loaded": []}
