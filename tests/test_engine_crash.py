"""An engine crash is survived (through the real server, ``lmsp serve``).

- ``kill -9`` of the real model's engine process during three batched tasks, one per
  ``on_restart`` policy: the API answers throughout; ``fail`` fails with
  ``engine_crashed``, ``retry`` starts over, ``resume`` continues from what it had
  committed, and every log is gap-free; the engine is started again and ``/healthz``,
  ``lmsp ps`` and ``/metrics`` say so. In exact mode (``LMSP_EXACT=1``) both finish
  with their uninterrupted text; in the fast default the resumed text is a valid
  continuation of what was committed (its later tokens may differ in the last bits).
- An engine that crashes again and again is not restarted forever: its model is marked
  failed, its tasks fail clearly, a task on another model completes.
- No engine process outlives the service: ``kill -9`` of the API process, a graceful
  stop, and a keep-alive unload each end it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.campaigns.invariants import deltas_since_reset
from tests.helpers import (
    Server,
    check_log_invariants,
    children,
    finish,
    open_db,
    task_log,
    wait_exited,
)
from tests.test_resume import text_of

MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"
JOBS: list[dict[str, Any]] = [
    {"input": "Write a story about a lighthouse.", "temperature": 0, "on_restart": "resume"},
    {
        "input": "Describe a storm at sea.",
        "temperature": 0.8,
        "seed": 99,
        "on_restart": "retry",
    },
    {"input": "List ten sea birds.", "temperature": 0, "on_restart": "fail"},
]

pytestmark = pytest.mark.slow


def body(job: dict[str, Any], model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "max_output_tokens": 96, "background": True, **job}


def wait_gone(pid: int, timeout: float = 30) -> None:
    assert wait_exited(pid, timeout), f"engine process {pid} outlived its service"


def engine(http: httpx.Client, model: str) -> dict[str, Any]:
    state = http.get("/v1/service/activity").json()
    return next(e for e in state["engines"] if e["model"] == model)


def wait_engine(http: httpx.Client, model: str, **want: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        found = [e for e in http.get("/healthz").json()["engines"] if e["model"] == model]
        if found and all(found[0][k] == v for k, v in want.items()):
            return found[0]
        assert time.monotonic() < deadline, (model, want, found)
        time.sleep(0.05)


class Prober(threading.Thread):
    """``/healthz`` and a response read, again and again: every answer must come."""

    def __init__(self, server: Server, response_id: str) -> None:
        super().__init__(daemon=True)
        self.server, self.response_id = server, response_id
        self.stop = threading.Event()
        self.answers = 0
        self.failures: list[str] = []
        self.slowest = 0.0

    def run(self) -> None:
        with self.server.client(timeout=10) as http:
            while not self.stop.is_set():
                for path in ("/healthz", f"/v1/responses/{self.response_id}"):
                    began = time.monotonic()
                    try:
                        status = http.get(path).status_code
                    except httpx.HTTPError as exc:
                        self.failures.append(f"{path}: {exc!r}")
                        continue
                    self.slowest = max(self.slowest, time.monotonic() - began)
                    self.answers += 1
                    if status != 200:
                        self.failures.append(f"{path}: {status}")
                time.sleep(0.02)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast"])
def test_kill_9_of_the_engine_during_batched_tasks(tmp_path: Path, exact: bool) -> None:
    data_dir = tmp_path / "data"
    env = {"LMSP_PARALLEL": "3", "LMSP_EXACT": "1" if exact else "0"}
    server = Server(data_dir, env=env).start()
    try:
        with server.client(timeout=300) as http:
            # the uninterrupted texts, batched together (exact: batched = solo, bit for bit)
            references = [http.post("/v1/responses", json=body(job)).json() for job in JOBS]
            references = [finish(http, r["id"]) for r in references]
            first = engine(http, MODEL)
            assert first["state"] == "ready" and first["restarts"] == 0

            created = [http.post("/v1/responses", json=body(job)).json() for job in JOBS]
            ids = [c["task"]["id"] for c in created]
            deadline = time.monotonic() + 300
            while True:  # all three generating, with text committed
                conn = open_db(data_dir)
                rows = conn.execute(
                    f"SELECT status, last_sequence_number FROM tasks WHERE id IN "
                    f"({','.join('?' * len(ids))})",
                    ids,
                ).fetchall()
                conn.close()
                if all(r["status"] == "running" and r["last_sequence_number"] > 8 for r in rows):
                    break
                assert time.monotonic() < deadline, [tuple(r) for r in rows]
                time.sleep(0.01)

            prober = Prober(server, created[0]["id"])
            prober.start()
            pid = engine(http, MODEL)["pid"]
            os.kill(pid, 9)
            wait_gone(pid)
            restarted = wait_engine(http, MODEL, state="ready", restarts=1)
            assert restarted["pid"] not in (None, pid) and restarted["crashes"] == 1
            assert "SIGKILL" in restarted["last_exit"]
            finals = [finish(http, c["id"]) for c in created]
            prober.stop.set()
            prober.join(30)
            assert prober.failures == [] and prober.answers > 10, prober.failures

            ps = http.get("/v1/service/activity").json()
            (loaded,) = ps["models"]
            assert loaded["pid"] == restarted["pid"] and loaded["restarts"] == 1
            metrics = http.get("/metrics").text
            assert re.search(rf'lmsp_engine_restarts_total\{{model="{MODEL}"\}} 1\.0', metrics)
            assert re.search(rf'lmsp_engine_crashes_total\{{model="{MODEL}"\}} 1\.0', metrics)
            assert f'lmsp_engine_pid{{model="{MODEL}"}} {restarted["pid"]}.0' in metrics

        resumed, retried, failed = finals
        assert failed["status"] == "failed" and failed["error"]["code"] == "engine_crashed"
        assert "SIGKILL" in failed["error"]["message"]
        for final, reference in ((resumed, references[0]), (retried, references[1])):
            if exact:  # the uninterrupted run's text, to the bit
                assert final["status"] == reference["status"]  # a stop token, or the budget
                assert final.get("incomplete_details") == reference.get("incomplete_details")
                assert text_of(final) == text_of(reference)
                assert final["usage"]["output_tokens"] == reference["usage"]["output_tokens"]
            else:  # a valid run: it ended as a run ends (a stop token, or the budget)
                assert final["status"] in ("completed", "incomplete"), final
                assert final["usage"]["output_tokens"] <= 96

        conn = open_db(data_dir)
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
        log = task_log(conn, ids[0])
        at = next(i for i, e in enumerate(log) if e.get("resumed"))
        committed = "".join(e["delta"] for e in log[:at] if "delta" in e)
        assert committed and text_of(resumed).startswith(committed)  # a continuation
        assert deltas_since_reset(log) == text_of(resumed)  # nothing lost or repeated
        retry_log = task_log(conn, ids[1])
        requeued = [e for e in retry_log if e["type"] == "response.queued" and e.get("reset")]
        assert len(requeued) == 1 and requeued[0]["attempt"] == 2
        assert deltas_since_reset(retry_log) == text_of(retried)
        conn.close()
    finally:
        server.stop()
    assert "the engine of smollm2-135m-instruct" in server.log_path.read_text()


def test_a_crash_loop_is_bounded_and_other_models_go_on(tmp_path: Path) -> None:
    env = {
        "LMSP_ENGINE_RESTARTS": "2",
        "LMSP_ENGINE_RESTART_WINDOW": "10m",
        "LMSP_MAX_LOADED_MODELS": "2",
        "LMSP_PARALLEL": "2",
        "LMSP_TEST_ENGINE_DELAY": "0.02",
    }
    server = Server(tmp_path / "data", env=env).start()
    try:
        with server.client(timeout=120) as http:
            doomed = http.post(
                "/v1/responses",
                json=body({"input": "[engine-crash]", "on_restart": "retry"}, TEST_MODEL),
            ).json()
            other = http.post(
                "/v1/responses", json=body({"input": "Say hello.", "temperature": 0})
            ).json()
            ended = finish(http, doomed["id"])
            assert ended["status"] == "failed" and ended["error"]["code"] == "engine_crashed"
            assert "crashed 3 times" in ended["error"]["message"]
            status = wait_engine(http, TEST_MODEL, state="failed")
            assert status["restarts"] == 2 and status["crashes"] == 3 and status["pid"] is None
            assert "is not started again" in status["error"]

            later = http.post("/v1/responses", json=body({"input": "hi"}, TEST_MODEL)).json()
            refused = finish(http, later["id"])
            assert refused["status"] == "failed"
            assert refused["error"]["code"] == "engine_crashed"
            assert "is not started again" in refused["error"]["message"]
            assert finish(http, other["id"])["status"] in ("completed", "incomplete")

            ps = http.get("/v1/service/activity").json()
            assert [m["model"] for m in ps["models"]] == [MODEL]
            shown = {e["model"]: e for e in ps["engines"]}
            assert shown[TEST_MODEL]["state"] == "failed" and shown[MODEL]["state"] == "ready"
            metrics = http.get("/metrics").text
            assert f'lmsp_engine_failed{{model="{TEST_MODEL}"}} 1.0' in metrics
            assert f'lmsp_engine_crashes_total{{model="{TEST_MODEL}"}} 3.0' in metrics
            assert f'lmsp_engine_restarts_total{{model="{TEST_MODEL}"}} 2.0' in metrics

            # an intact blob, verified, lets the model start again
            verified = http.post(f"/v1/models/{TEST_MODEL}/verify")
            assert verified.status_code == 200, verified.text
            again = http.post("/v1/responses", json=body({"input": "hi"}, TEST_MODEL)).json()
            assert finish(http, again["id"])["status"] in ("completed", "incomplete")
        check_log_invariants(open_db(server.data_dir))
    finally:
        server.stop()


def test_no_engine_outlives_its_service(tmp_path: Path) -> None:
    env = {"LMSP_KEEP_ALIVE": "1s"}
    server = Server(tmp_path / "data", env=env).start()
    try:
        with server.client() as http:
            made = http.post("/v1/responses", json=body({"input": "hi"}, TEST_MODEL)).json()
            finish(http, made["id"])
            pid = engine(http, TEST_MODEL)["pid"]
            wait_gone(pid)  # its keep-alive ran out: the engine is stopped
            assert wait_engine(http, TEST_MODEL, state="stopped")["pid"] is None

            made = http.post("/v1/responses", json=body({"input": "hi"}, TEST_MODEL)).json()
            finish(http, made["id"])
            pid = engine(http, TEST_MODEL)["pid"]
        server.stop()  # a graceful stop stops its engines
        wait_gone(pid)

        server.extra_env.pop("LMSP_KEEP_ALIVE")
        server.start()
        with server.client() as http:
            http.post("/v1/responses", json=body({"input": "slow " * 50}, TEST_MODEL))
            wait_engine(http, TEST_MODEL, state="ready")
            pid = engine(http, TEST_MODEL)["pid"]
        assert server.proc is not None and pid in children(server.proc.pid)
        started = children(server.proc.pid)  # its engine, and multiprocessing's helper
        server.kill()  # kill -9 of the API process: they follow
        for child in started:
            wait_gone(child, timeout=10)
    finally:
        server.stop()
