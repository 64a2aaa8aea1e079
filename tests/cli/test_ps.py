"""``lmsp ps`` and ``GET /v1/service/activity``: the loaded models with their memory,
the sequences being generated with their speed, the queue and the clients, for the
owner only; ``--watch`` refreshes until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.bootstrap import DEFAULT_MODEL_ID
from lmsp.cli import main
from lmsp.config import Settings
from lmsp.store.blobs import blob_path
from tests.helpers import Server, seeded_data_dir

pytestmark = pytest.mark.slow


def lmsp(server: Server, *args: str, token: str | None = None) -> Any:
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir), "LMSP_TOKEN": token}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_ps_shows_models_sequences_queue_and_clients(tmp_path: Path, blob_cache: Path) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.3", "LMSP_PARALLEL": "1"}).start()
    try:
        with server.client() as owner:
            made = owner.post(
                "/v1/clients",
                json={"name": "busy-agent", "scopes": ["responses:read", "responses:write"]},
            ).json()
        agent = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {made['token']}"}
        )
        with agent:
            first, second = (
                agent.post(
                    "/v1/responses",
                    json={"model": "lmsp-test", "input": f"ps {n}", "background": True},
                ).json()
                for n in range(2)
            )
            deadline = time.monotonic() + 60
            state: dict[str, Any] = {}
            while time.monotonic() < deadline:  # until the first has a few tokens out
                result = lmsp(server, "ps", "--json")
                assert result.exit_code == 0, result.output
                state = json.loads(result.stdout)
                running = state["sequences"]
                if running and running[0]["output_tokens"] >= 3:
                    break
                time.sleep(0.1)
            (seq,) = state["sequences"]
            assert seq["task_id"] == first["task"]["id"] and seq["client_id"] == made["id"]
            assert seq["response_id"] == first["id"] and seq["model"] == "lmsp-test"
            assert seq["prompt_tokens"] > 0 and seq["tokens_per_second"] > 0
            assert state["queue"]["queued"] == 1
            (model,) = state["models"]
            assert model["model"] == "lmsp-test" and model["busy"] and model["memory_bytes"] > 0
            (client,) = state["clients"]
            assert client["name"] == "busy-agent" and (client["running"], client["queued"]) == (
                1,
                1,
            )
            table = lmsp(server, "ps").stdout
            shown = ("Models loaded", "lmsp-test", "TOKENS/S", "busy-agent", first["task"]["id"])
            assert all(text in table for text in shown), table
            assert "1 task(s) waiting" in table
            # an agent's token is not the owner's
            refused = lmsp(server, "ps", token=made["token"])
            assert refused.exit_code == 1 and "lacks the scope 'admin'" in refused.stderr

            watch = subprocess.Popen(
                [sys.executable, "-m", "lmsp", "ps", "--watch", "--interval", "0.2"],
                env=dict(os.environ, LMSP_URL=server.url, LMSP_DATA_DIR=str(data_dir)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            time.sleep(2)
            watch.send_signal(signal.SIGINT)
            out, err = watch.communicate(timeout=30)
            assert watch.returncode == 0, err
            assert out.decode().count("Models loaded") >= 2  # refreshed, not printed once
            for obj in (first, second):
                agent.post(f"/v1/responses/{obj['id']}/cancel")
    finally:
        server.stop()


def test_the_real_model_shows_its_memory(settings: Settings) -> None:
    with TestClient(create_app(settings)) as http:
        token = (settings.data_dir / "owner.token").read_text().strip()
        http.headers["Authorization"] = f"Bearer {token}"
        done = http.post(
            "/v1/responses",
            json={"model": DEFAULT_MODEL_ID, "input": "Hi.", "max_output_tokens": 4},
        )
        assert done.status_code == 200, done.text
        # its answer is committed before its worker lets go of the engine's slot
        deadline = time.monotonic() + 10
        while True:
            state = http.get("/v1/service/activity").json()
            # an ended task is not a sequence being generated, even before that
            assert state["sequences"] == []
            if not state["models"][0]["busy"] or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    (model,) = state["models"]
    assert model["model"] == DEFAULT_MODEL_ID and not model["busy"]
    size = blob_path(settings.blobs_dir, model["digest"]).stat().st_size
    # the tensors (about the file's size) plus a KV cache for the context
    assert model["memory_bytes"] > size
    assert 0 < model["unloads_in"] <= settings.keep_alive
    assert state["sequences"] == [] and state["queue"]["queued"] == 0


def test_a_prompt_being_read_shows_its_size(tmp_path: Path, blob_cache: Path) -> None:
    """Before its first token a running task shows its prompt's size, not 0."""
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "1.0"}).start()
    try:
        with server.client() as owner:
            made = owner.post(
                "/v1/responses",
                json={"model": "lmsp-test", "input": "a prompt of some words", "background": True},
            ).json()
            deadline = time.monotonic() + 60
            before_output: dict[str, Any] = {}  # the last look before its first token
            while time.monotonic() < deadline:
                sequences = owner.get("/v1/service/activity").json()["sequences"]
                if sequences and sequences[0]["output_tokens"] > 0:
                    break
                if sequences:
                    before_output = sequences[0]
                time.sleep(0.02)
            assert before_output["response_id"] == made["id"]
            assert before_output["prompt_tokens"] > 0  # it was 0 until the first token
            owner.post(f"/v1/responses/{made['id']}/cancel")
    finally:
        server.stop()
