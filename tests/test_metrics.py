"""``GET /metrics``: Prometheus text that parses, whose counters move as tasks run
through a real server (and across a ``kill -9`` and its recovery), and which needs the
owner's token once the service listens beyond loopback."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lmsp.api.app import create_app
from lmsp.bootstrap import DEFAULT_MODEL_ID
from lmsp.config import Settings
from tests.helpers import Server, seeded_data_dir

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(text: str) -> Samples:
    """Every sample of the exposition, by name and labels (the parser refuses bad text)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def wait_for(http: httpx.Client, response_id: str, status: str) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        obj: dict[str, object] = http.get(f"/v1/responses/{response_id}").json()
        if obj["status"] == status:
            return obj
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never reached {status}")


@pytest.mark.slow
def test_counters_move_as_tasks_run_through_the_server(tmp_path: Path, blob_cache: Path) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.1"}).start()
    try:
        anonymous = httpx.get(f"{server.url}/metrics")  # loopback: no token needed
        assert anonymous.status_code == 200
        assert anonymous.headers["content-type"].startswith("text/plain")
        before = scrape(anonymous.text)
        with server.client() as http:
            done = [
                http.post(
                    "/v1/responses",
                    json={"model": "lmsp-test", "input": f"count {n}", "background": True},
                ).json()
                for n in range(3)
            ]
            finished = [wait_for(http, r["id"], "completed") for r in done]
            after = scrape(http.get("/metrics").text)
            # each task's log is gap-free from 0: its length is its last number + 1
            logged = sum(
                int(http.get(f"/v1/tasks/{r['task']['id']}").json()["last_sequence_number"]) + 1
                for r in done
            )
        generated = sum(int(r["usage"]["output_tokens"]) for r in finished)  # type: ignore[index]
        prompt = sum(int(r["usage"]["input_tokens"]) for r in finished)  # type: ignore[index]
        model = {"model": "lmsp-test"}

        def moved(name: str, **labels: str) -> float:
            return total(after, name, **labels) - total(before, name, **labels)

        assert moved("lmsp_generated_tokens_total", **model) == generated
        assert moved("lmsp_prompt_tokens_total", **model) == prompt
        assert moved("lmsp_time_to_first_token_seconds_count", **model) == 3
        assert moved("lmsp_tokens_per_second_count", **model) == 3
        assert moved("lmsp_model_loads_total", **model) >= 1
        assert value(after, "lmsp_tasks", status="completed") == 3
        assert value(after, "lmsp_queue_depth") == 0
        assert value(after, "lmsp_running_sequences") == 0
        # each task logged its events (a delta event carries a flush's text, not one
        # token: their number is the logs' length); the writer grouped jobs
        assert moved("lmsp_events_written_total") >= logged >= 3 * 5
        assert moved("lmsp_write_transactions_total") >= 1
        assert moved("lmsp_write_commit_seconds_count") == moved("lmsp_write_transactions_total")
        # the writer's CPU in its transactions: some, and never more than their time
        assert 0 < moved("lmsp_write_cpu_seconds_total") <= moved("lmsp_write_commit_seconds_sum")
        assert moved("lmsp_write_jobs_per_transaction_sum") >= moved(
            "lmsp_write_jobs_per_transaction_count"
        )
        posts = dict(method="POST", route="/v1/responses", status="202")
        assert moved("lmsp_http_requests_total", **posts) == 3
        assert moved("lmsp_http_request_seconds_count", method="POST", route="/v1/responses") == 3
        polled = total(after, "lmsp_http_requests_total", route="/v1/responses/{response_id}")
        assert polled >= 3  # a route template, not one label per response id
        assert not any("resp_" in str(labels) for _, labels in after)

        # a task that is running when the service is killed: resumed at startup
        with server.client() as http:
            slow = http.post(
                "/v1/responses",
                json={
                    "model": "lmsp-test",
                    "input": "interrupted",
                    "background": True,
                    "on_restart": "resume",
                },
            ).json()
            wait_for(http, slow["id"], "in_progress")
            task_url = f"/v1/tasks/{slow['task']['id']}"
            deadline = time.monotonic() + 60  # text logged: a snapshot to resume from
            while http.get(task_url).json()["last_sequence_number"] < 6:
                assert time.monotonic() < deadline, "the task logged no text"
                time.sleep(0.02)
        server.kill()
        server.start()
        with server.client() as http:
            recovered = scrape(http.get("/metrics").text)
            wait_for(http, slow["id"], "completed")
        assert value(recovered, "lmsp_recovered_tasks_total", policy="resume", outcome="resumed")
        assert total(recovered, "lmsp_recovered_tasks_total") == 1
    finally:
        server.stop()


@pytest.mark.slow
def test_the_real_engine_reports_its_tokens(settings: Settings) -> None:
    with TestClient(create_app(settings)) as http:
        token = (settings.data_dir / "owner.token").read_text().strip()
        http.headers["Authorization"] = f"Bearer {token}"
        made = http.post(
            "/v1/responses",
            json={"model": DEFAULT_MODEL_ID, "input": "Say hello.", "max_output_tokens": 8},
        )
        assert made.status_code == 200, made.text
        usage = made.json()["usage"]
        samples = scrape(http.get("/metrics").text)
    model = {"model": DEFAULT_MODEL_ID}
    assert value(samples, "lmsp_generated_tokens_total", **model) == usage["output_tokens"]
    assert value(samples, "lmsp_prompt_tokens_total", **model) == usage["input_tokens"]
    assert value(samples, "lmsp_time_to_first_token_seconds_count", **model) == 1
    assert value(samples, "lmsp_model_loads_total", **model) == 1


def test_beyond_loopback_metrics_need_the_owners_token(settings: Settings) -> None:
    exposed = dataclasses.replace(settings, host="0.0.0.0")
    with TestClient(create_app(exposed)) as http:
        owner = (settings.data_dir / "owner.token").read_text().strip()
        bare = http.get("/metrics")
        assert bare.status_code == 401 and bare.json()["error"]["type"] == "authentication_error"
        made = http.post(
            "/v1/clients",
            json={"name": "agent", "scopes": ["responses:read", "models:read"]},
            headers={"Authorization": f"Bearer {owner}"},
        )
        agent = made.json()["token"]
        refused = http.get("/metrics", headers={"Authorization": f"Bearer {agent}"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "insufficient_scope"
        allowed = http.get("/metrics", headers={"Authorization": f"Bearer {owner}"})
        assert allowed.status_code == 200
        samples = scrape(allowed.text)
        bare_counted = dict(method="GET", route="/metrics", status="401")
        assert value(samples, "lmsp_http_requests_total", **bare_counted) == 1
