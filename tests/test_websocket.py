"""Issue 39: ``GET /v1/responses`` as a WebSocket, through a real ``lmsp serve`` and the
``websockets`` library (and the openai SDK's ``client.responses.connect()``).

Before this, every upgrade was answered ``403`` (no such route): each test here failed
at the connect.
"""

from __future__ import annotations

import json
import os
import re
import socket as stdlib_socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.helpers import Server, open_db, rss_mib

MODEL = "lmsp-test"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
FINISHED = {"completed", "incomplete", "failed", "cancelled"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("ws") / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0.005", "LMSP_WS_CACHE_BYTES": "4000"},
    )
    srv.start()
    yield srv
    srv.stop()


def ws_url(server: Server, path: str = "/v1/responses") -> str:
    return server.url.replace("http://", "ws://") + path


def socket(server: Server, token: str | None = None, **headers: str) -> ClientConnection:
    given = {"Authorization": f"Bearer {token or server.token}", **headers}
    return connect(ws_url(server), additional_headers=given, max_size=None, open_timeout=60)


def turn(ws: ClientConnection, timeout: float = 120, **body: Any) -> list[dict[str, Any]]:
    """One ``response.create`` and the frames up to its terminal one (or error)."""
    frame = {"type": "response.create", "model": MODEL, "max_output_tokens": 6, **body}
    ws.send(json.dumps(frame))
    return frames_of(ws, timeout)


def frames_of(ws: ClientConnection, timeout: float = 120) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while True:
        frames.append(json.loads(ws.recv(timeout=timeout)))
        if frames[-1]["type"] in TERMINAL:
            return frames


def error_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(frames) == 1 and frames[0]["type"] == "error", frames
    envelope = frames[0]
    assert set(envelope) == {"type", "status", "error"}
    return dict(envelope["error"]) | {"status": envelope["status"]}


def sse_data(http: httpx.Client, response_id: str) -> list[dict[str, Any]]:
    with http.stream("GET", f"/v1/responses/{response_id}", params={"stream": "true"}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_two_turns_and_a_store_false_continuation_on_one_socket(server: Server) -> None:
    with socket(server) as ws, server.client() as http:
        first = turn(ws, input="Remember: cobalt.")
        second = turn(ws, input="And now?", store=False)
        kept = second[-1]["response"]["id"]
        third = turn(ws, input="What was it?", store=False, previous_response_id=kept)
        # a stored turn's frames are its SSE stream's events, the same sequence numbers
        assert first[-1]["type"] == "response.incomplete"
        assert first == sse_data(http, first[-1]["response"]["id"])
        numbers = [frame["sequence_number"] for frame in first]
        assert numbers == sorted(numbers) and first[0]["type"] == "response.created"
        assert sum(frame["type"] in TERMINAL for frame in first + second + third) == 3
        assert third[-1]["type"] == "response.incomplete", third[-1]
        # the continuation saw the first store: false turn's input and output
        saw = third[-1]["response"]["usage"]["input_tokens"]
        alone = turn(ws, input="What was it?", store=False)[-1]["response"]["usage"]
        assert saw > alone["input_tokens"]
        # nothing of a store: false response is kept on disk, and the socket is still open
        assert http.get(f"/v1/responses/{kept}").status_code == 404
        assert turn(ws, input="Still there?")[-1]["type"] == "response.incomplete"


def test_a_store_false_response_is_not_found_on_another_socket(server: Server) -> None:
    with socket(server) as ws:
        kept = turn(ws, input="Remember: copper.", store=False)[-1]["response"]["id"]
    with socket(server) as ws:
        error = error_of(turn(ws, input="Continue.", store=False, previous_response_id=kept))
        assert (error["status"], error["code"]) == (400, "previous_response_not_found")
        assert error["param"] == "previous_response_id"
        missing = turn(ws, input="x", previous_response_id="resp_openresponses_missing_1")
        assert error_of(missing)["code"] == "previous_response_not_found"
        assert turn(ws, input="recovered", store=False)[-1]["type"] == "response.incomplete"


def test_a_failed_continuation_evicts_it(server: Server) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_missing", "output": "No call."}
    with socket(server) as ws:
        kept = turn(ws, input="Remember: ember.", store=False)[-1]["response"]["id"]
        failed = error_of(turn(ws, input=[orphan], store=False, previous_response_id=kept))
        assert (failed["code"], failed["param"]) == ("invalid_value", "input.0.call_id")
        stale = error_of(turn(ws, input="stale", store=False, previous_response_id=kept))
        assert stale["code"] == "previous_response_not_found"
        assert "failed" in stale["message"]


def test_the_cache_is_bounded_and_says_what_it_dropped(server: Server) -> None:
    """4,000 bytes (``LMSP_WS_CACHE_BYTES``): the oldest response goes for a newer one."""
    with socket(server) as ws:
        big = "word " * 300  # 1,500 bytes of input each
        ids = [turn(ws, input=big, store=False)[-1]["response"]["id"] for _ in range(3)]
        oldest = error_of(turn(ws, input="x", store=False, previous_response_id=ids[0]))
        assert oldest["code"] == "previous_response_not_found"
        assert "LMSP_WS_CACHE_BYTES" in oldest["message"]
        newest = turn(ws, input="x", store=False, previous_response_id=ids[2])
        assert newest[-1]["type"] == "response.incomplete"


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ({"stream": True}, "unsupported_parameter", "stream"),
        ({"background": True}, "unsupported_parameter", "background"),
        ({"stream_options": {}}, "unsupported_parameter", "stream_options"),
        ({"generate": False}, "unsupported_parameter", "generate"),
        ({"type": "response.steer"}, "invalid_value", "type"),
        ({"temperature": 9}, "invalid_value", "temperature"),
        ({"metadata": {"idempotency_key": "\n"}}, "invalid_idempotency_key", None),
    ],
)
def test_a_refused_turn_gets_one_envelope_and_the_socket_stays(
    server: Server, frame: dict[str, Any], code: str, param: str | None
) -> None:
    with socket(server) as ws:
        error = error_of(turn(ws, input="Hi.", **frame))
        assert error["code"] == code and error["status"] == 400
        if param is not None:
            assert error["param"] == param
        ws.send("not json")
        assert error_of(frames_of(ws))["code"] == "invalid_json"
        assert turn(ws, input="Hi.")[-1]["type"] == "response.incomplete"


def test_an_idempotency_key_replays_a_turn(server: Server) -> None:
    body = {"input": "Once.", "metadata": {"idempotency_key": "turn-1"}}
    with socket(server) as ws:
        first = turn(ws, **body)
    with socket(server) as ws:
        again = turn(ws, **body)
        assert again == first  # the first turn's events, not a second response
        other = error_of(turn(ws, **(body | {"input": "Twice."})))
        assert other["code"] == "idempotency_key_reused"


def test_auth_scope_origin_and_host_are_checked_as_for_http(server: Server) -> None:
    def refused(**headers: str) -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as caught:
            connect(ws_url(server), additional_headers=headers, open_timeout=60)
        response = caught.value.response
        return response.status_code, json.loads(response.body or b"{}")

    status, body = refused()
    assert (status, body["error"]["code"]) == (401, "invalid_token")
    status, body = refused(Authorization="Bearer lmsp_nope")
    assert status == 401
    with server.client() as http:
        made = http.post("/v1/clients", json={"name": "reader", "scopes": ["responses:read"]})
        assert made.status_code in (200, 201), made.text
        reader = made.json()["token"]
    status, body = refused(Authorization=f"Bearer {reader}")
    assert (status, body["error"]["code"]) == (403, "insufficient_scope")
    owner = f"Bearer {server.token}"
    status, body = refused(Authorization=owner, Origin="https://evil.example")
    assert (status, body["error"]["code"]) == (403, "cross_site_request")
    status, body = refused(Authorization=owner, Host="evil.example")
    assert (status, body["error"]["code"]) == (421, "misdirected_request")
    # the same origin (a page of lmsp's own) is let in
    with socket(server, Origin=server.url) as ws:
        assert turn(ws, input="Hi.")[-1]["type"] == "response.incomplete"


def test_sockets_show_in_metrics_and_activity(server: Server) -> None:
    with socket(server) as ws, server.client() as http:
        turn(ws, input="Hi.")
        activity = http.get("/v1/service/activity").json()["websockets"]
        assert activity["open"] >= 1 and any(s["turns"] == 1 for s in activity["sockets"])
        metrics = http.get("/metrics").text
        assert "lmsp_websockets_open" in metrics and "lmsp_websocket_turns_total" in metrics


def test_the_openai_sdk_connects_and_continues(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token)
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Count to 3.", store=False, max_output_tokens=5)
        first = next(e for e in conn if e.type in TERMINAL)
        conn.response.create(
            model=MODEL, input="Go on.", store=False, previous_response_id=first.response.id
        )
        second = next(e for e in conn if e.type in TERMINAL)
        assert second.type in ("response.completed", "response.incomplete")
        conn.response.create(model=MODEL, input="x", previous_response_id="resp_missing")
        missing = next(e for e in conn if e.type in TERMINAL)
        assert missing.type == "error" and missing.error.code == "previous_response_not_found"


# -- durability and limits (servers of their own) ---------------------------------------------
def status_of(http: httpx.Client, response_id: str) -> str:
    return str(http.get(f"/v1/responses/{response_id}").json()["status"])


def wait_status(http: httpx.Client, response_id: str, wanted: set[str], wait: float = 120) -> str:
    deadline = time.monotonic() + wait
    while (status := status_of(http, response_id)) not in wanted:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


def test_a_dropped_socket_leaves_a_stored_turn_running(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.05"}).start()
    try:
        with socket(srv) as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "input": "Go.",
                        "max_output_tokens": 40,
                    }
                )
            )
            created = json.loads(ws.recv(timeout=60))
            assert created["type"] == "response.created"
        stored = created["response"]["id"]
        with srv.client() as http:
            # the socket is gone; the turn is not cancelled, it finishes
            assert wait_status(http, stored, FINISHED) in ("completed", "incomplete")
            events = sse_data(http, stored)
            assert events[0] == created  # the log from its start to its terminal event
            assert events[-1]["type"] in ("response.completed", "response.incomplete")
    finally:
        srv.stop()


def test_kill_9_during_a_stored_turn_is_recovered_readable_and_continuable(
    tmp_path: Path,
) -> None:
    srv = Server(tmp_path / "data", env={"LMSP_TEST_ENGINE_DELAY": "0.1"}).start()
    try:
        with socket(srv) as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "input": "Go.",
                        "max_output_tokens": 60,
                        "on_restart": "resume",
                    }
                )
            )
            seen = [json.loads(ws.recv(timeout=60)) for _ in range(8)]
            stored = seen[0]["response"]["id"]
            srv.kill()  # kill -9 mid-turn: the socket dies with the process
            with pytest.raises((ConnectionClosed, TimeoutError, OSError)):
                ws.recv(timeout=10)
        srv.start()
        with srv.client() as http:
            assert wait_status(http, stored, FINISHED) in ("completed", "incomplete")
            events = sse_data(http, stored)
            numbers = [e["sequence_number"] for e in events]
            # the full log over HTTP, the frames seen before the kill its first events
            assert events[: len(seen)] == seen
            assert numbers[-1] == max(numbers) and events[-1]["type"] in (
                "response.completed",
                "response.incomplete",
            )
            later = http.get(
                f"/v1/responses/{stored}", params={"stream": "true", "starting_after": 5}
            )
            assert 'sequence_number":6' in later.text.replace(" ", "")
        with socket(srv) as ws:
            more = turn(ws, input="Continue.", previous_response_id=stored)
            assert more[-1]["type"] in ("response.completed", "response.incomplete")
            assert more[-1]["response"]["previous_response_id"] == stored
        with open_db(srv.data_dir) as conn:
            row = conn.execute(
                "SELECT status FROM tasks WHERE response_id = ?", (stored,)
            ).fetchone()
            assert row["status"] == "completed"
    finally:
        srv.stop()


def test_idle_age_and_per_client_limits(tmp_path: Path) -> None:
    env = {"LMSP_WS_IDLE_TIMEOUT": "1s", "LMSP_WS_PER_CLIENT": "2", "LMSP_MAX_BODY_BYTES": "65536"}
    srv = Server(tmp_path / "data", env=env).start()
    try:
        with socket(srv) as ws:
            limit = error_of(frames_of(ws, timeout=30))
            assert limit["code"] == "websocket_connection_limit_reached"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
        with socket(srv), socket(srv):
            with pytest.raises(InvalidStatus) as caught:
                socket(srv)
            assert caught.value.response.status_code == 429
            assert b"too_many_websockets" in (caught.value.response.body or b"")
        with socket(srv) as ws:  # a frame over LMSP_MAX_BODY_BYTES closes with 1009
            ws.send(json.dumps({"type": "response.create", "input": "x" * 70_000}))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    finally:
        srv.stop()


def test_a_connection_is_closed_at_its_max_age(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", env={"LMSP_WS_MAX_AGE": "3s"}).start()
    try:
        with socket(srv) as ws:
            assert turn(ws, input="Hi.")[-1]["type"] == "response.incomplete"
            limit = error_of(frames_of(ws, timeout=30))
            assert limit["code"] == "websocket_connection_limit_reached"
            assert "LMSP_WS_MAX_AGE" in limit["message"]
    finally:
        srv.stop()


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_socket_outlives_the_http_deadlines(tmp_path: Path, parser: str) -> None:
    """With h11, the body deadline armed by the upgrade request fired into the socket
    and wrote a raw ``408`` into its frames ("reserved bits must be 0")."""
    env = {"LMSP_HTTP": parser, "LMSP_BODY_TIMEOUT": "1s", "LMSP_HEADER_TIMEOUT": "1s"}
    srv = Server(tmp_path / "data", env=env).start()
    try:
        with socket(srv) as ws:
            time.sleep(3)
            assert turn(ws, input="Hi.")[-1]["type"] == "response.incomplete"
    finally:
        srv.stop()


def test_the_client_examples_of_the_docs_run(server: Server, tmp_path: Path) -> None:
    """docs/clients.md's two WebSocket examples, as written (only the port differs),
    against the server (its test model as the model they name)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "clients.md").read_text()
    section = text[text.index("## WebSocket mode") :]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 2
    env = dict(os.environ, AGENT_TOKEN=server.token)
    for index, block in enumerate(blocks):
        script = block.replace("127.0.0.1:8430", f"127.0.0.1:{server.port}")
        script = script.replace('"smollm2-135m-instruct"', f'"{MODEL}"')
        path = tmp_path / f"example{index}.py"
        path.write_text(script)
        ran = subprocess.run(
            [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, ran.stderr
        assert "Traceback" not in ran.stderr
    assert "'type': 'response." in ran.stdout  # the last event the second one printed


def test_64_idle_sockets_and_a_slow_reader_stay_within_a_memory_bound(tmp_path: Path) -> None:
    """64 idle sockets and a client that stops reading (a 16 KiB receive buffer, 300
    turns of 24 KB of events each asked for, nothing read) cost the server at most
    :data:`RSS_BOUND_MIB` of resident memory: the turns wait on the socket, the events
    on disk. The slow reader is closed after ``LMSP_WS_SEND_TIMEOUT`` and the turn it
    stopped in finishes all the same. The figures are printed (measured here: 100.1 MiB
    before, 101.7 with the 64 idle sockets, 106.7 at most with the slow reader)."""
    env = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_WS_SEND_TIMEOUT": "3s", "LMSP_WS_PER_CLIENT": "80"}
    srv = Server(tmp_path / "data", env=env).start()
    assert srv.proc is not None
    try:
        with socket(srv) as warm:  # the model loaded, a first turn's allocations made
            turn(warm, input="Warm up.")
        before = rss_mib(srv.proc.pid)
        idle = [socket(srv) for _ in range(64)]
        with_idle = rss_mib(srv.proc.pid)
        raw = stdlib_socket.socket()
        raw.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_RCVBUF, 16384)
        raw.connect(("127.0.0.1", srv.port))
        slow = connect(
            ws_url(srv),
            sock=raw,
            additional_headers={"Authorization": f"Bearer {srv.token}"},
            max_queue=1,
            ping_interval=None,
        )
        # 24 KB of metadata, sent back in each turn's three lifecycle events
        metadata = {f"k{key}": "x" * 512 for key in range(16)}
        for index in range(300):
            frame = {"model": MODEL, "input": f"{index}", "metadata": metadata}
            slow.send(json.dumps({"type": "response.create", **frame}))
        with srv.client() as http:
            peak, closed = with_idle, 0.0
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not closed:
                peak = max(peak, rss_mib(srv.proc.pid))
                closed = metric(http, 'lmsp_websockets_closed_total{reason="slow_reader"}')
                time.sleep(0.2)
            assert closed == 1, "the slow reader was never closed"
            with open_db(srv.data_dir) as conn:
                turns = conn.execute("SELECT response_id FROM tasks").fetchall()
            assert 2 < len(turns) < 300  # it stopped the turns short
            for row in turns:
                status = wait_status(http, row["response_id"], FINISHED)
                assert status in ("completed", "incomplete")  # none cancelled
            assert metric(http, "lmsp_websockets_open") == 64  # the idle ones
        growth = peak - before
        print(
            f"\nRSS: {before:.1f} MiB before, {with_idle:.1f} with 64 idle sockets,"
            f" {peak:.1f} at most with the slow reader ({len(turns) - 1} turns run for it):"
            f" +{growth:.1f} MiB (bound {RSS_BOUND_MIB} MiB)"
        )
        assert growth < RSS_BOUND_MIB
        for ws in idle:
            ws.close()
        slow.close()
    finally:
        srv.stop()


#: what 64 idle sockets and one slow reader may add to the server's resident memory
RSS_BOUND_MIB = 32


def metric(http: httpx.Client, name: str) -> float:
    """A sample of ``/metrics`` by its name and labels as written (0 when absent)."""
    for line in http.get("/metrics").text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    return 0.0
