"""Work is charged however it ends, and a client that leaves stops its work (issue 36,
items 4, 9 and 13), through a real ``lmsp serve``.

- A stream cancelled after a few deltas, a stream whose client drops it (responses and
  chat completions), a task that fails after generating, one stopped by a ``kill -9``
  and an MCP task cancelled during its call carry the tokens they consumed in their
  response's ``usage`` and in the usage ledger (before: ``usage: null``, 0 tokens).
- Embeddings are charged to their client and held to its ``tokens_per_day`` (before:
  never counted, never refused).
- A non-streaming request whose client closes the connection is cancelled and its
  generation stops, on every route (before: it ran to its end).
- A default ``/v1/responses`` stream skips the log numbers of the LMSP lifecycle events
  it leaves out; ``include=lmsp.lifecycle`` shows every number, and a resume from any
  number is exact (the documented rule).

The test engine writes at most 24 words, one token each, a word every 0.25 s here: a
cancel after the first words arrives long before the last.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, open_db, seeded_data_dir
from tests.test_fair_share import new_client
from tests.test_mcp_tools import McpServer, body, of_type

pytestmark = pytest.mark.slow

TEST_MODEL = "lmsp-test"
#: every answer of the test engine, run to its end, has this many tokens
WHOLE = 24
DELAY = "0.25"
SCOPES = ["responses:read", "responses:write"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_TEST_ENGINE_DELAY": DELAY, "LMSP_PARALLEL": "4", "LMSP_RESERVED_SEQUENCES": "0"}
    srv = Server(tmp_path_factory.mktemp("charged") / "data", env).start()
    yield srv
    srv.stop()


def wait_for(check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def ledger(http: httpx.Client) -> dict[str, int]:
    """The client's own usage, summed (every model, every day)."""
    rows = http.get("/v1/usage").json()["data"]
    keys = ("requests", "input_tokens", "cached_tokens", "output_tokens")
    return {key: sum(int(row[key]) for row in rows) for key in keys}


def only_task(http: httpx.Client, finished: bool = True, past: int = 4) -> dict[str, Any]:
    """The client's one task, once it has finished (or, ``finished=False``, once it
    is running and has logged more than ``past`` events: text, by default)."""

    def check() -> dict[str, Any] | None:
        tasks = http.get("/v1/tasks").json()["data"]
        if len(tasks) != 1:
            return None
        task: dict[str, Any] = tasks[0]
        if finished:
            return task if task["status"] in ("completed", "failed", "cancelled") else None
        # created, loading, in_progress, the output item and its part: then text
        running = task["status"] == "running"
        return task if running and task["last_sequence_number"] > past else None

    found: dict[str, Any] = wait_for(check)
    return found


def sse_data(stream: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in stream.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line[len("data: ") :])


def charged_as_shown(http: httpx.Client, usage: dict[str, Any]) -> dict[str, int]:
    """The ledger holds exactly the one request and the usage its response shows."""
    counted = ledger(http)
    assert counted == {
        "requests": 1,
        "input_tokens": usage["input_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "output_tokens": usage["output_tokens"],
    }
    return counted


# -- item 4: cancelled, dropped and failed work is charged -------------------------------------
def test_a_stream_cancelled_after_some_deltas_is_charged(server: Server) -> None:
    _, http = new_client(server, "cancels", SCOPES)
    deltas = 0
    ask = {"model": TEST_MODEL, "input": "Count for me.", "stream": True}
    with http.stream("POST", "/v1/responses", json=ask) as stream:
        for event in sse_data(stream):
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
            elif event["type"] == "response.output_text.delta":
                deltas += len(event["delta"].split())
                if deltas == 3:
                    assert http.post(f"/v1/responses/{response_id}/cancel").status_code == 200
            last = event
    assert last["type"] == "response.cancelled"
    usage = last["response"]["usage"]  # the terminal event carries it
    assert usage is not None, "a cancelled response carries what it consumed"
    assert 3 <= usage["output_tokens"] < WHOLE
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert http.get(f"/v1/responses/{response_id}").json()["usage"] == usage
    charged_as_shown(http, usage)
    http.close()


@pytest.mark.parametrize("route", ["responses", "chat"])
def test_a_dropped_stream_is_charged(server: Server, route: str) -> None:
    _, http = new_client(server, f"drops-{route}", SCOPES)
    if route == "responses":
        path, ask = "/v1/responses", {"model": TEST_MODEL, "input": "Count.", "stream": True}
    else:
        path = "/v1/chat/completions"
        ask = {"model": TEST_MODEL, "messages": [{"role": "user", "content": "Count."}]}
        ask["stream"] = True
    words = 0
    with http.stream("POST", path, json=ask) as stream:
        for event in sse_data(stream):
            text = event.get("delta") if route == "responses" else None
            if route == "chat" and event.get("choices"):
                text = event["choices"][0]["delta"].get("content")
            words += len((text or "").split())
            if words >= 2:
                break  # the client drops the stream: the task is cancelled
    task = only_task(http)
    assert task["status"] == "cancelled"
    usage = http.get(f"/v1/responses/{task['response_id']}").json()["usage"]
    assert 2 <= usage["output_tokens"] < WHOLE
    charged_as_shown(http, usage)
    http.close()


def test_a_task_that_fails_after_generating_is_charged(server: Server) -> None:
    """The test engine fails a prompt holding ``[engine-error]`` after its third word."""
    _, http = new_client(server, "fails", SCOPES)
    done = http.post("/v1/responses", json={"model": TEST_MODEL, "input": "[engine-error] go"})
    assert done.status_code == 200, done.text
    failed = done.json()
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_error"
    assert failed["usage"]["output_tokens"] == 3
    assert failed["usage"]["input_tokens"] > 0
    charged_as_shown(http, failed["usage"])
    http.close()


def test_a_task_stopped_by_a_kill_is_charged_what_its_log_holds(
    tmp_path: Path, blob_cache: Path
) -> None:
    """Startup recovery fails a running task (``on_restart: fail``): it is charged the
    tokens its snapshot committed and its prompt."""
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    srv = Server(data_dir, {"LMSP_TEST_ENGINE_DELAY": DELAY}).start()
    try:
        _, http = new_client(srv, "killed", SCOPES)
        ask = {"model": TEST_MODEL, "input": "Count.", "background": True, "on_restart": "fail"}
        response_id = http.post("/v1/responses", json=ask).json()["id"]
        only_task(http, finished=False, past=5)  # a background one: queued too
        http.close()
        srv.kill()
        srv.start()
        _, twin = new_client(srv, "twin", SCOPES)
        whole = twin.post("/v1/responses", json={**ask, "background": False}).json()
        twin.close()
        with srv.client() as owner:
            failed = owner.get(f"/v1/responses/{response_id}").json()
            logged = owner.get(
                f"/v1/tasks/{failed['task']['id']}/events",
                headers={"Accept": "application/json"},
                params={"limit": 100},
            ).json()["data"]
    finally:
        srv.stop()
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"
    text = "".join(e["delta"] for e in logged if e["type"] == "response.output_text.delta")
    assert failed["usage"]["output_tokens"] >= len(text.split()) >= 1
    assert failed["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    conn = open_db(tmp_path / "data")
    try:
        row = conn.execute(
            "SELECT sum(output_tokens) FROM usage_daily u JOIN clients c ON c.id = u.client_id"
            " WHERE c.name = 'killed'"
        ).fetchone()
        assert row[0] == failed["usage"]["output_tokens"]
        check_log_invariants(conn)
    finally:
        conn.close()


def test_an_mcp_task_cancelled_during_its_call_is_charged(server: Server, tmp_path: Path) -> None:
    """The MCP loop's own cancel path (the real model writes the call's arguments)."""
    tools = McpServer(tmp_path)
    try:
        _, http = new_client(server, "mcp", SCOPES)
        ask = {**body(tools.url, "slow_record"), "background": True}
        response_id = http.post("/v1/responses", json=ask).json()["id"]
        wait_for(tools.lines, timeout=600)  # the call is in flight (its tool waits a minute)
        http.post(f"/v1/responses/{response_id}/cancel")
        task = only_task(http)
        done = http.get(f"/v1/responses/{response_id}").json()
    finally:
        tools.stop()
    assert task["status"] == "cancelled"
    assert of_type(done["output"], "mcp_call")[0]["status"] == "incomplete"
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0
    charged_as_shown(http, done["usage"])
    http.close()


def test_embeddings_are_charged_and_held_to_the_day_s_tokens(server: Server) -> None:
    client_id, http = new_client(server, "embeds", SCOPES)
    texts = ["one two three four", "five six seven"]
    first = http.post("/v1/embeddings", json={"model": TEST_MODEL, "input": texts})
    assert first.status_code == 200, first.text
    spent = first.json()["usage"]["prompt_tokens"]
    assert ledger(http) == {
        "requests": 1,
        "input_tokens": spent,
        "cached_tokens": 0,
        "output_tokens": 0,
    }
    with server.client() as owner:
        limited = owner.patch(
            f"/v1/clients/{client_id}", json={"limits": {"tokens_per_day": spent}}
        )
        assert limited.status_code == 200, limited.text
    refused = http.post("/v1/embeddings", json={"model": TEST_MODEL, "input": texts})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["Retry-After"]) <= 86400
    assert ledger(http)["requests"] == 1  # the refusal was not charged
    # and a response too: the day's tokens are the embeddings' as well
    assert http.post("/v1/responses", json={"model": TEST_MODEL, "input": "x"}).status_code == 429
    http.close()


# -- item 9: a client that leaves a non-streaming request cancels it ---------------------------
def leave_while_running(server: Server, token: str, path: str, ask: dict[str, Any]) -> None:
    """Send a non-streaming request, wait until its task has written some text, then
    close the connection without reading the answer."""
    payload = json.dumps(ask).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http,
    ):
        sock.sendall(head + payload)
        only_task(http, finished=False)


ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "responses": ("/v1/responses", {"model": TEST_MODEL, "input": "Count."}),
    "chat": (
        "/v1/chat/completions",
        {"model": TEST_MODEL, "messages": [{"role": "user", "content": "Count."}]},
    ),
    "completions": ("/v1/completions", {"model": TEST_MODEL, "prompt": "Count.", "max_tokens": 64}),
    "messages": (
        "/v1/messages",
        {
            "model": TEST_MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Count."}],
        },
    ),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_non_streaming_request_whose_client_leaves_is_cancelled(
    server: Server, route: str
) -> None:
    _, http = new_client(server, f"leaves-{route}", SCOPES)
    token = http.headers["Authorization"].removeprefix("Bearer ")
    path, ask = ROUTES[route]
    leave_while_running(server, token, path, ask)
    task = only_task(http)
    assert task["status"] == "cancelled", task  # before: completed, all 24 tokens
    usage = http.get(f"/v1/responses/{task['response_id']}").json()["usage"]
    assert 1 <= usage["output_tokens"] < WHOLE  # the generation stopped
    charged_as_shown(http, usage)
    http.close()


def test_a_compaction_whose_client_leaves_is_cancelled_and_forgotten(server: Server) -> None:
    _, http = new_client(server, "leaves-compact", SCOPES)
    token = http.headers["Authorization"].removeprefix("Bearer ")
    history = [
        {"role": "user", "content": "Remember the number seven."},
        {"role": "assistant", "content": "I will remember seven."},
        {"role": "user", "content": "What was it?"},
    ]
    leave_while_running(
        server, token, "/v1/responses/compact", {"model": TEST_MODEL, "input": history}
    )
    # the summary nobody will read stops, and goes once stopped
    wait_for(lambda: http.get("/v1/tasks").json()["data"] == [])
    counted = ledger(http)
    assert counted["requests"] == 1 and 1 <= counted["output_tokens"] < WHOLE
    http.close()


def test_a_background_request_runs_on_when_its_client_leaves(server: Server) -> None:
    _, http = new_client(server, "background", SCOPES)
    token = http.headers["Authorization"].removeprefix("Bearer ")
    ask = {"model": TEST_MODEL, "input": "Count.", "background": True}
    leave_while_running(server, token, "/v1/responses", ask)
    task = only_task(http)
    assert task["status"] == "completed"
    assert ledger(http)["output_tokens"] == WHOLE
    http.close()


# -- item 13: what a stream numbers ------------------------------------------------------------
def numbers(http: httpx.Client, response_id: str, **params: str) -> list[tuple[int, str]]:
    with http.stream(
        "GET", f"/v1/responses/{response_id}", params={"stream": "true", **params}
    ) as stream:
        return [(e["sequence_number"], e["type"]) for e in sse_data(stream)]


def test_a_stream_shows_the_log_s_numbers_and_resumes_from_any(server: Server) -> None:
    _, http = new_client(server, "numbers", SCOPES)
    done = http.post("/v1/responses", json={"model": TEST_MODEL, "input": "Hi."}).json()
    whole = numbers(http, done["id"], include="lmsp.lifecycle")
    assert [n for n, _ in whole] == list(range(len(whole)))  # the log: gap-free from 0
    shown = numbers(http, done["id"])
    hidden = {"response.loading", "response.cancelling"}
    assert shown == [(n, kind) for n, kind in whole if kind not in hidden]
    skipped = [n for n, kind in whole if kind in hidden]
    assert skipped == [1]  # response.loading, between created (0) and in_progress (2)
    for after in range(len(whole) - 1):  # a resume from any number, a hidden one too
        resumed = numbers(http, done["id"], starting_after=str(after))
        assert resumed == [(n, kind) for n, kind in shown if n > after]
    http.close()
