"""The low findings of issue 30 (item 7), each reproduced on a real ``lmsp serve``:
recursive ``$ref`` schemas refused at create, ``/healthz`` degraded while a model cannot
run, limits named in errors, Anthropic ``tool_result`` ids checked, a bad
``LMSP_DATABASE_URL`` in one line, and a cleanly stopped node listed as ``left``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, served
from tests.pgcluster import Cluster
from tests.test_clock_skew import node, scalar

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"
#: a linked list without an end: every node must hold the next (no finite instance)
ENDLESS = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
    "required": ["value", "next"],
}
#: a tree whose every node must have a child
ENDLESS_TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "children": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"}}
            },
            "required": ["children"],
        }
    },
    "$ref": "#/$defs/node",
}
#: a tree whose leaves have no children: recursive, and fine
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_ENGINE_RESTARTS": "0", "LMSP_TEST_ENGINE_DELAY": "0.01"}
    with served(Path(tmp_path_factory.mktemp("low")) / "data", env) as srv:
        yield srv


def error(answer: httpx.Response) -> dict[str, Any]:
    return dict(answer.json()["error"])


@pytest.mark.parametrize("schema", [ENDLESS, ENDLESS_TREE], ids=["list", "tree"])
def test_an_endless_recursive_ref_is_refused_when_created(
    server: Server, schema: dict[str, Any]
) -> None:
    """Before: accepted, then the model wrote until its output limit ran out (an
    instance never ends)."""
    fmt = {"type": "json_schema", "name": "shape", "schema": schema}
    with server.client(timeout=120) as http:
        before = http.get("/v1/tasks", params={"limit": 100}).json()["data"]
        body = {
            "model": MODEL,
            "input": "A shape.",
            "text": {"format": fmt},
            "max_output_tokens": 16,
        }
        made = http.post("/v1/responses", json=body)
        assert made.status_code == 400, made.text
        assert error(made)["code"] == "unsupported_schema"
        assert error(made)["param"].startswith("text.format.schema.")
        assert error(made)["param"].endswith("$ref")
        assert "no finite instance" in error(made)["message"]
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Call it."}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "max_tokens": 16,
            },
        )
        assert chat.status_code == 400, chat.text
        assert error(chat)["code"] == "unsupported_schema"
        assert error(chat)["param"].startswith("tools.0.function.parameters")
        after = http.get("/v1/tasks", params={"limit": 100}).json()["data"]
        assert after == before  # nothing written


def test_a_recursion_that_can_end_still_runs(server: Server) -> None:
    fmt = {"type": "json_schema", "name": "tree", "schema": TREE}
    with server.client(timeout=120) as http:
        body = {
            "model": MODEL,
            "input": "A tree.",
            "text": {"format": fmt},
            "max_output_tokens": 32,
        }
        made = http.post("/v1/responses", json=body)
        assert made.status_code == 200, made.text
        assert made.json()["status"] in ("completed", "incomplete")


def test_healthz_is_degraded_while_a_model_cannot_run(server: Server) -> None:
    with server.client(timeout=120) as http:
        assert http.get("/healthz").json()["status"] == "ok"
        body = {"model": TEST_MODEL, "input": "[engine-crash]", "max_output_tokens": 16}
        crashed = http.post("/v1/responses", json=body).json()
        assert crashed["status"] == "failed", crashed
        deadline = time.monotonic() + 60
        while True:
            health = http.get("/healthz")
            if health.json()["status"] != "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert health.status_code == 200  # the service serves: the model does not
        shown = health.json()
        assert shown["status"] == "degraded", shown
        assert [m["model"] for m in shown["failed_models"]] == [TEST_MODEL]
        assert shown["failed_models"][0]["error"]


def test_limits_are_named_in_the_errors(server: Server) -> None:
    """Before: ``stop: Input should be a valid string`` for a fifth stop string."""
    with server.client() as http:
        stop = http.post(
            "/v1/chat/completions",
            json={
                "model": TEST_MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "stop": list("abcde"),
            },
        )
        assert stop.status_code == 400
        assert "at most 4 items" in error(stop)["message"] and error(stop)["param"] == "stop"
        items = [{"role": "user", "content": "x"}] * 4097
        many = http.post("/v1/responses", json={"model": TEST_MODEL, "input": items})
        assert many.status_code == 400
        assert "at most 4096 items" in error(many)["message"] and error(many)["param"] == "input"
        blocks = [{"type": "text", "text": "x"}] * 4097
        anthropic = http.post(
            "/v1/messages",
            json={
                "model": TEST_MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": blocks}],
            },
        )
        assert anthropic.status_code == 400
        assert "at most 4096 items" in anthropic.json()["error"]["message"], anthropic.text
        for answer in (stop, many, anthropic):
            assert "valid string" not in answer.text


@pytest.mark.parametrize(
    ("answers", "said"),
    [(["toolu_9"], "unexpected tool_use_id"), (["toolu_1", "toolu_1"], "answered twice")],
)
def test_a_tool_result_must_answer_a_tool_use_once(
    server: Server, answers: list[str], said: str
) -> None:
    asked = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}],
    }
    results = [{"type": "tool_result", "tool_use_id": i, "content": "sunny"} for i in answers]
    body = {
        "model": TEST_MODEL,
        "max_tokens": 8,
        "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            asked,
            {"role": "user", "content": results},
        ],
    }
    with server.client() as http:
        answer = http.post("/v1/messages", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "error"
    assert said in answer.json()["error"]["message"]


@pytest.mark.parametrize("url", ["postgresql://nobody@127.0.0.1:1/x", "postgresql://u:pw@[bad"])
def test_a_bad_database_url_is_one_line(tmp_path: Path, url: str) -> None:
    """Before: a 97-line traceback."""
    env = {**os.environ, "LMSP_DATA_DIR": str(tmp_path / "data"), "LMSP_DATABASE_URL": url}
    env["LMSP_PORT"] = "1"  # never reached: the database is checked first
    run = subprocess.run(
        [sys.executable, "-m", "lmsp", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: cannot use LMSP_DATABASE_URL")
    assert lines[0].endswith("(database_unreachable)") and "pw" not in lines[0]


def test_a_cleanly_stopped_node_is_left_not_lost(tmp_path: Path, pg_cluster: Cluster) -> None:
    url = pg_cluster.database()
    first = node(tmp_path, url, "a").start()
    second = node(tmp_path, url, "b").start()
    try:
        second.stop()  # SIGTERM: it leaves the cluster
        assert scalar(url, "SELECT status FROM nodes WHERE id = 'b'") == "left"
        # past its lease (3 s) and several rescue passes of the node still up
        time.sleep(6)
        assert scalar(url, "SELECT status FROM nodes WHERE id = 'b'") == "left"
        activity = first.client().get("/v1/service/activity").json()
        shown = {n["id"]: n["status"] for n in activity["nodes"]}
        assert shown == {"a": "up", "b": "left"}
    finally:
        second.stop()
        first.stop()
