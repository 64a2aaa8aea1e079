"""Structured logs: with ``LMSP_LOG_FORMAT=json`` a whole server run (pairing, background,
streamed, cancelled and real-model tasks, a kill and a restart) writes one JSON object
a line, naming tasks, responses, clients and requests by id, and no token, prompt or
output text; the default format is human-readable and carries the same ids."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.bootstrap import DEFAULT_MODEL_ID
from tests.helpers import Server, message_text, seeded_data_dir

pytestmark = pytest.mark.slow

CANARY = "zebra-canary-7731 what the agent asked"


def finished(http: httpx.Client, response_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        obj: dict[str, Any] = http.get(f"/v1/responses/{response_id}").json()
        if obj["status"] not in ("queued", "in_progress"):
            return obj
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never finished")


def pair(server: Server) -> tuple[str, str]:
    """An agent pairs by the device flow; the owner approves it. ``(client id, token)``."""
    asked = httpx.post(f"{server.url}/v1/pairing", json={"client_name": "log-agent"}).json()
    with server.client() as owner:
        owner.post(f"/v1/pairing/{asked['user_code']}/approve")
        grant = httpx.post(f"{server.url}/v1/pairing/{asked['id']}/token").json()
        agents = [c for c in owner.get("/v1/clients").json()["data"] if c["name"] == "log-agent"]
        agent_id = agents[0]["id"]
    return agent_id, grant["token"]


def test_a_json_log_run_parses_names_ids_and_leaks_nothing(
    tmp_path: Path, blob_cache: Path
) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(
        data_dir, env={"LMSP_LOG_FORMAT": "json", "LMSP_TEST_ENGINE_DELAY": "0.05"}
    ).start()
    outputs: list[str] = []
    try:
        agent_id, token = pair(server)
        tokens = [server.token, token]
        agent = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )
        with agent:
            made = [
                agent.post(
                    "/v1/responses",
                    json={"model": "lmsp-test", "input": f"{CANARY} {n}", "background": True},
                    headers={"X-Request-Id": f"req-log-{n}"},
                ).json()
                for n in range(2)
            ]
            cancelled = agent.post(
                "/v1/responses",
                json={"model": "lmsp-test", "input": f"{CANARY} stop", "background": True},
            ).json()
            agent.post(f"/v1/responses/{cancelled['id']}/cancel")
            with agent.stream(
                "POST",
                "/v1/responses",
                json={"model": "lmsp-test", "input": f"{CANARY} streamed", "stream": True},
            ) as streamed:
                lines = [line for line in streamed.iter_lines() if line.startswith("data: {")]
            streamed_id = json.loads(lines[0][len("data: ") :])["response"]["id"]
            real = agent.post(
                "/v1/responses",
                json={"model": DEFAULT_MODEL_ID, "input": CANARY, "max_output_tokens": 12},
            ).json()
            resumed = agent.post(
                "/v1/responses",
                json={
                    "model": "lmsp-test",
                    "input": f"{CANARY} resumed",
                    "background": True,
                    "on_restart": "resume",
                },
            ).json()
            objs = [finished(agent, r["id"]) for r in made]
            server.restart()  # the resumed task may be running: recovery logs it too
            objs += [finished(agent, r["id"]) for r in (cancelled, resumed)]
            objs += [finished(agent, streamed_id), real]
        outputs = [message_text(o["output"]) for o in objs if message_text(o["output"])]
    finally:
        server.stop()
    assert {o["status"] for o in objs} >= {"completed", "cancelled"}

    raw = server.log_path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in raw if line.strip()]  # every line is JSON
    assert len(records) > 20
    for record in records:
        assert {"time", "level", "event", "message", "logger"} <= set(record)
        assert record["time"].endswith("Z") and record["level"] in {"debug", "info", "warning"}
    task_ids = {o["task"]["id"] for o in objs}
    logged_tasks = {r["task_id"] for r in records if "task_id" in r}
    assert task_ids <= logged_tasks
    ended = [r for r in records if r["event"] == "task.run_ended"]
    ran = {o["id"] for o in objs if o["status"] == "completed"}  # a cancel may win in queue
    assert {r["response_id"] for r in ended} >= ran
    assert all(r["client_id"] == agent_id for r in ended)
    created = [r for r in records if r["event"] == "response.created"]
    assert {r["request_id"] for r in created} >= {"req-log-0", "req-log-1"}
    assert {r["client_id"] for r in created} == {agent_id}
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    assert access and all(r.get("request_id") for r in access)
    assert any(r["event"] == "service.start" for r in records)

    text = "\n".join(raw)
    assert "n_ctx_train" not in text  # llama.cpp's notes are below the default level
    for secret in tokens:
        assert secret not in text and secret[len("lmsp_") + 6 :] not in text
    assert "zebra-canary" not in text
    assert outputs and not [out for out in outputs if out in text]


def test_the_default_log_is_human_readable_with_the_ids(tmp_path: Path, blob_cache: Path) -> None:
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache)).start()
    try:
        with server.client() as http:
            made = http.post(
                "/v1/responses",
                json={"model": "lmsp-test", "input": CANARY, "background": True},
            ).json()
            done = finished(http, made["id"])
        # the banner's one-time console link signs a browser in, once
        start = server.log_path.read_text(encoding="utf-8")
        link = start.split("console: ", 1)[1].split()[0]
        assert link.startswith(f"{server.url}/console/login#code=")
        code = {"code": link.split("#code=", 1)[1]}
        first = httpx.post(f"{server.url}/console/session", json=code)
        assert first.status_code == 201 and "set-cookie" not in first.headers
        assert httpx.post(f"{server.url}/console/session", json=code).status_code == 401
    finally:
        server.stop()
    raw = server.log_path.read_text(encoding="utf-8").splitlines()
    ended = [line for line in raw if "left the runner" in line]
    assert len(ended) == 1 and ended[0].split()[2] == "INFO"
    assert f"response_id={made['id']}" in ended[0] and done["task"]["id"] in ended[0]
    assert not [line for line in raw if line.startswith("{")]
    banner = f"owner token (admin): {server.data_dir / 'owner.token'}"
    assert [line for line in raw if banner in line]  # the serve banner says where it is
    assert "zebra-canary" not in "\n".join(raw)
