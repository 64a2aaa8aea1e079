"""MCP tools in ``/v1/responses`` end to end: a real ``lmsp serve``, the real model
(smollm2, its calls forced with ``tool_choice``) and a real MCP server built with the
``mcp`` SDK (``tests/mcp_server.py``, streamable HTTP on loopback, in a process of its
own that outlives lmsp's ``kill -9``), whose ledger file counts every effect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, free_port, open_db, task_log

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
#: a response that ran to its end (the text after the calls may reach max_output_tokens)
ENDED = ("completed", "incomplete")
ENV = {"LMSP_MCP_TIMEOUT": "8s"}


class McpServer:
    """``tests/mcp_server.py`` in a process of its own, and its ledger."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.ledger = root / f"ledger-{self.port}.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_server", str(self.port), str(self.ledger)],
            stdout=(root / f"mcp-{self.port}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/mcp", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the MCP server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def tools_server(tmp_path: Path) -> Iterator[McpServer]:
    server = McpServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lmsp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("mcp") / "data", ENV).start()
    try:
        yield server
    finally:
        server.stop()


def tool(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "ledger",
        "server_url": url,
        "require_approval": "never",
        **extra,
    }


def body(url: str, name: str, **extra: Any) -> dict[str, Any]:
    """A request that forces a call of ``name`` (then one call at most)."""
    allowed = extra.pop("allowed_tools", [name])
    return {
        "model": MODEL,
        "input": "Please use the tool.",
        "tools": [tool(url, allowed_tools=allowed, **extra.pop("tool", {}))],
        "tool_choice": {"type": "mcp", "server_label": "ledger", "name": name},
        "max_tool_calls": 1,
        "max_output_tokens": 60,
        "temperature": 0,
        **extra,
    }


def of_type(output: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in output if item["type"] == kind]


def wait_for(check: Any, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def finished(api: httpx.Client, response_id: str, timeout: float = 300) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        got: dict[str, Any] = api.get(f"/v1/responses/{response_id}").json()
        return got if got["status"] not in ("queued", "in_progress") else None

    result: dict[str, Any] = wait_for(check, timeout)
    return result


# -- a forced call ----------------------------------------------------------------------------
def test_a_forced_call_runs_on_the_server(lmsp: Server, tools_server: McpServer) -> None:
    with lmsp.client(timeout=300) as api:
        answer = api.post(
            "/v1/responses",
            json=body(tools_server.url, "record", allowed_tools=["record", "whoami"]),
        )
        assert answer.status_code == 200, answer.text
        response = answer.json()
    assert response["status"] in ENDED
    (listed,) = of_type(response["output"], "mcp_list_tools")
    assert sorted(t["name"] for t in listed["tools"]) == ["record", "whoami"]  # allowed only
    assert listed["server_label"] == "ledger" and listed.get("error") is None
    schema = next(t for t in listed["tools"] if t["name"] == "record")["input_schema"]
    assert schema["required"] == ["note"]
    (call,) = of_type(response["output"], "mcp_call")
    arguments = json.loads(call["arguments"])
    assert set(arguments) == {"note"} and isinstance(arguments["note"], str)
    assert len(arguments["note"]) <= 12  # held to the tool's inputSchema
    assert call["status"] == "completed" and call["error"] is None
    assert call["output"] == "recorded note number 1"
    assert call["name"] == "record" and call["server_label"] == "ledger"
    assert tools_server.lines() == [f"record {arguments['note']}"]
    # the list comes first, the call after it
    types = [item["type"] for item in response["output"]]
    assert types.index("mcp_list_tools") < types.index("mcp_call")
    # operators: the metrics count calls per server, `lmsp tasks show` prints the loop
    with lmsp.client() as api:
        metrics = api.get("/metrics").text
    assert 'lmsp_mcp_calls_total{kind="call",outcome="ok",server="ledger"}' in metrics
    shown = subprocess.run(
        [sys.executable, "-m", "lmsp", "tasks", "show", response["id"]],
        env={**os.environ, "LMSP_URL": lmsp.url, "LMSP_TOKEN": lmsp.token, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "MCP loop" in shown.stdout and "recorded note number 1" in shown.stdout
    assert "call record(" in shown.stdout


def test_the_events_are_openai_s(lmsp: Server, tools_server: McpServer) -> None:
    with lmsp.client(timeout=300) as api:
        response = api.post(
            "/v1/responses", json={**body(tools_server.url, "record"), "background": True}
        ).json()
        done = finished(api, response["id"])
        task_id = done["task"]["id"]
    assert done["status"] in ENDED
    log = task_log(open_db(lmsp.data_dir), task_id)
    types = [event["type"] for event in log]
    for kind in (
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ):
        assert kind in types, kind
    # the journal: the arguments and in_progress are logged before the result
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    deltas = "".join(e["delta"] for e in log if e["type"] == "response.mcp_call_arguments.delta")
    (args_done,) = [e for e in log if e["type"] == "response.mcp_call_arguments.done"]
    assert deltas == args_done["arguments"]
    assert [e["sequence_number"] for e in log] == list(range(len(log)))


def test_headers_reach_the_server_and_are_never_shown(
    lmsp: Server, tools_server: McpServer
) -> None:
    secret = {"X-Token": "sesame"}
    with lmsp.client(timeout=300) as api:
        request = body(tools_server.url, "whoami", tool={"headers": secret})
        response = api.post("/v1/responses", json=request).json()
        (call,) = of_type(response["output"], "mcp_call")
        assert call["output"] == "token ok"
        shown = json.dumps(response)
        assert "sesame" not in shown
        assert response["tools"][0]["headers"] == {"X-Token": "[redacted]"}
        again = api.get(f"/v1/responses/{response['id']}").text
        items = api.get(f"/v1/responses/{response['id']}/input_items").text
    assert "sesame" not in again and "sesame" not in items
    stored = open_db(lmsp.data_dir).execute("SELECT request FROM responses").fetchall()
    assert all("sesame" not in row[0] for row in stored)
    assert "sesame" not in lmsp.log_path.read_text()


def test_cancel_stops_a_task_during_a_call(lmsp: Server, tools_server: McpServer) -> None:
    with lmsp.client(timeout=300) as api:
        request = {**body(tools_server.url, "slow_record"), "background": True}
        response = api.post("/v1/responses", json=request).json()
        wait_for(tools_server.lines)  # the call is in flight (its tool waits a minute)
        api.post(f"/v1/responses/{response['id']}/cancel")
        done = finished(api, response["id"])
    assert done["status"] == "cancelled"
    (call,) = of_type(done["output"], "mcp_call")
    assert call["status"] == "incomplete" and call["output"] is None
    assert len(tools_server.lines()) == 1


# -- refusals and failures --------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    ["http://example.com/mcp", "ftp://127.0.0.1/mcp", "http://10.0.0.1:8000/mcp", "nonsense"],
)
def test_a_server_outside_the_allowed_hosts_is_400(lmsp: Server, url: str) -> None:
    with lmsp.client() as api:
        before = api.get("/v1/tasks").json()["data"]
        answer = api.post("/v1/responses", json=body(url, "record"))
        after = api.get("/v1/tasks").json()["data"]
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_mcp_server" and error["param"] == "tools.0.server_url"
    assert len(after) == len(before)  # nothing written


def test_chat_completions_refuse_mcp_tools(lmsp: Server, tools_server: McpServer) -> None:
    with lmsp.client() as api:
        answer = api.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [tool(tools_server.url)],
            },
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "unsupported_parameter"


def test_a_hanging_server_ends_in_an_error_item_within_the_timeout(
    lmsp: Server, tools_server: McpServer
) -> None:
    with lmsp.client(timeout=300) as api:
        response = api.post("/v1/responses", json=body(tools_server.url, "hang")).json()
    assert response["status"] in ENDED
    (call,) = of_type(response["output"], "mcp_call")
    assert call["status"] == "failed" and call["output"] is None
    assert "did not answer within 8s" in call["error"]["message"]


def test_a_server_that_is_down_fails_the_list_step(lmsp: Server, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with lmsp.client(timeout=300) as api:
        response = api.post("/v1/responses", json=body(url, "record")).json()
    assert response["status"] in ENDED
    (listed,) = of_type(response["output"], "mcp_list_tools")
    assert listed["tools"] == []
    assert "Could not reach the MCP server" in listed["error"]
    assert url in listed["error"]
    assert of_type(response["output"], "mcp_call") == []


# -- approvals ------------------------------------------------------------------------------------
def test_approval_round_trip(lmsp: Server, tools_server: McpServer) -> None:
    request = body(tools_server.url, "record", tool={"require_approval": "always"})
    with lmsp.client(timeout=300) as api:
        first = api.post("/v1/responses", json=request).json()
        assert first["status"] in ENDED
        (asked,) = of_type(first["output"], "mcp_approval_request")
        assert asked["name"] == "record" and json.loads(asked["arguments"])["note"] is not None
        assert of_type(first["output"], "mcp_call") == []
        assert tools_server.lines() == []  # nothing runs before the approval

        def answer(approve: bool) -> dict[str, Any]:
            follow = {
                **request,
                "previous_response_id": first["id"],
                "input": [
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": asked["id"],
                        "approve": approve,
                    }
                ],
            }
            follow.pop("tool_choice")
            got: dict[str, Any] = api.post("/v1/responses", json=follow).json()
            return got

        refused = answer(False)
        assert refused["status"] in ENDED, refused
        assert of_type(refused["output"], "mcp_call") == []
        assert tools_server.lines() == []  # approve: false never runs it

        approved = answer(True)
        assert approved["status"] in ENDED, approved
        calls = of_type(approved["output"], "mcp_call")
        assert calls[0]["approval_request_id"] == asked["id"]
        assert calls[0]["arguments"] == asked["arguments"]
        assert calls[0]["output"] == "recorded note number 1"
    assert tools_server.lines() == [f"record {json.loads(asked['arguments'])['note']}"]


# -- the journal across kill -9 -------------------------------------------------------------------
def events_of(server: Server, task_id: str) -> list[dict[str, Any]]:
    return task_log(open_db(server.data_dir), task_id)


def seen(server: Server, task_id: str, kind: str) -> bool:
    return any(event["type"] == kind for event in events_of(server, task_id))


@pytest.mark.parametrize("policy", ["resume", "retry"])
def test_kill_9_after_a_call_completed_never_repeats_it(
    tmp_path: Path, tools_server: McpServer, policy: str
) -> None:
    server = Server(tmp_path / "data", ENV).start()
    try:
        with server.client(timeout=300) as api:
            request = {
                **body(tools_server.url, "record"),
                "background": True,
                "on_restart": policy,
                "max_output_tokens": 400,
                "input": "Use the tool, then write a long story about a cat.",
            }
            response = api.post("/v1/responses", json=request).json()
            task_id = response["task"]["id"]
            wait_for(lambda: seen(server, task_id, "response.mcp_call.completed"))
        server.kill()  # the call is done and journaled; the model generates on
        assert tools_server.lines()[0].startswith("record ")
        server.start()
        with server.client(timeout=300) as api:
            done = finished(api, response["id"])
    finally:
        server.stop()
    assert done["status"] in ENDED, done
    (call,) = of_type(done["output"], "mcp_call")
    assert call["status"] == "completed" and call["output"] == "recorded note number 1"
    assert len(tools_server.lines()) == 1  # exactly one effect


def test_kill_9_during_a_slow_call_does_not_repeat_it(
    tmp_path: Path, tools_server: McpServer
) -> None:
    server = Server(tmp_path / "data", ENV).start()
    try:
        with server.client(timeout=300) as api:
            request = {
                **body(tools_server.url, "slow_record"),
                "background": True,
                "on_restart": "resume",
            }
            response = api.post("/v1/responses", json=request).json()
            wait_for(tools_server.lines)  # the call is in flight
        server.kill()
        server.start()
        with server.client(timeout=300) as api:
            done = finished(api, response["id"])
    finally:
        server.stop()
    assert done["status"] in ENDED, done
    (call,) = of_type(done["output"], "mcp_call")
    assert call["status"] == "failed"
    assert call["error"]["message"] == "interrupted by a restart; not repeated"
    assert len(tools_server.lines()) == 1  # not re-issued


def test_kill_9_during_a_slow_call_fails_a_fail_policy_task(
    tmp_path: Path, tools_server: McpServer
) -> None:
    server = Server(tmp_path / "data", ENV).start()
    try:
        with server.client(timeout=300) as api:
            request = {
                **body(tools_server.url, "slow_record"),
                "background": True,
                "on_restart": "fail",
            }
            response = api.post("/v1/responses", json=request).json()
            wait_for(tools_server.lines)
        server.kill()
        server.start()
        with server.client(timeout=300) as api:
            done = finished(api, response["id"])
    finally:
        server.stop()
    assert done["status"] == "failed" and done["error"]["code"] == "server_restarted"
    (call,) = of_type(done["output"], "mcp_call")
    assert call["status"] == "incomplete" and call["output"] is None
    assert len(tools_server.lines()) == 1


def test_kill_9_during_a_read_only_call_calls_it_again(
    tmp_path: Path, tools_server: McpServer
) -> None:
    server = Server(tmp_path / "data", ENV).start()
    try:
        with server.client(timeout=300) as api:
            request = {
                **body(tools_server.url, "slow_read"),
                "background": True,
                "on_restart": "resume",
            }
            response = api.post("/v1/responses", json=request).json()
            wait_for(tools_server.lines)  # the first (slow) read is in flight
        server.kill()
        server.start()
        with server.client(timeout=300) as api:
            done = finished(api, response["id"])
    finally:
        server.stop()
    assert done["status"] in ENDED, done
    (call,) = of_type(done["output"], "mcp_call")
    assert call["status"] == "completed" and call["error"] is None
    assert call["output"].endswith("(read 2)")  # the second call's result is the one used
    assert len(tools_server.lines()) == 2
