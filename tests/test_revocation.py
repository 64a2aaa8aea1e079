"""A revoked client's open streams end with an error event (issue 8, defect 9)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, open_db

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("revoke") / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0.3", "LMSP_PARALLEL": "3"},
    ).start()
    yield srv
    srv.stop()


def agent(server: Server) -> tuple[str, str]:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients", json={"name": "agent", "scopes": ["responses:read", "responses:write"]}
        ).json()
    return made["id"], made["token"]


def frames(stream: httpx.Response) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    for line in stream.iter_lines():
        if not line:
            if fields:
                yield fields
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.lstrip(" ")
    if fields:
        yield fields


def follow_until_revoked(
    server: Server, token: str, client_id: str, method: str, path: str, body: Any = None
) -> tuple[list[dict[str, str]], float]:
    headers = {"Authorization": f"Bearer {token}"}
    seen: list[dict[str, str]] = []
    revoked_at = 0.0
    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=30) as http,
        http.stream(method, path, json=body) as stream,
    ):
        assert stream.status_code == 200
        for frame in frames(stream):
            seen.append(frame)
            deltas = [f for f in seen if f.get("event") == "response.output_text.delta"]
            if len(deltas) == 2 and not revoked_at:
                with server.client() as owner:
                    assert owner.delete(f"/v1/clients/{client_id}").status_code == 200
                revoked_at = time.monotonic()
    return seen, revoked_at


def ends_revoked(seen: list[dict[str, str]]) -> None:
    if seen[-1].get("data") == "[DONE]":  # a /v1/responses stream's last line
        seen = seen[:-1]
    last = seen[-1]
    assert last.get("event") == "error" and "id" not in last, last
    data = json.loads(last["data"])
    assert data["code"] == "token_revoked" and data["error"]["code"] == "token_revoked"
    kinds = [f.get("event") for f in seen]
    assert "response.completed" not in kinds
    # it ended well before the task would have (24 tokens at 0.3 s each)
    assert kinds.count("response.output_text.delta") < 20


def test_a_task_event_stream_ends_when_its_client_is_revoked(server: Server) -> None:
    client_id, token = agent(server)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http:
        task_id = http.post(
            "/v1/responses", json={"model": "lmsp-test", "input": "x", "background": True}
        ).json()["task"]["id"]
    seen, _ = follow_until_revoked(server, token, client_id, "GET", f"/v1/tasks/{task_id}/events")
    ends_revoked(seen)


def test_a_response_stream_ends_and_its_task_is_cancelled(server: Server) -> None:
    client_id, token = agent(server)
    body = {"model": "lmsp-test", "input": "y", "stream": True}
    seen, _ = follow_until_revoked(server, token, client_id, "POST", "/v1/responses", body)
    ends_revoked(seen)
    response_id = json.loads(seen[0]["data"])["response"]["id"]

    def status() -> str:
        conn = open_db(server.data_dir)
        try:
            row = conn.execute("SELECT status FROM tasks WHERE response_id = ?", (response_id,))
            return str(row.fetchone()[0])
        finally:
            conn.close()

    deadline = time.monotonic() + 30
    while status() != "cancelled":
        assert time.monotonic() < deadline, "the revoked client's task ran on"
        time.sleep(0.05)


def test_a_resumed_response_stream_ends_too(server: Server, tmp_path: Path) -> None:
    client_id, token = agent(server)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http:
        response_id = http.post(
            "/v1/responses", json={"model": "lmsp-test", "input": "z", "background": True}
        ).json()["id"]
    path = f"/v1/responses/{response_id}?stream=true"
    seen, _ = follow_until_revoked(server, token, client_id, "GET", path)
    ends_revoked(seen)


def task_status(server: Server, task_id: str) -> str:
    conn = open_db(server.data_dir)
    try:
        return str(conn.execute("SELECT status FROM tasks WHERE id = ?", (task_id,)).fetchone()[0])
    finally:
        conn.close()


def test_revoking_a_client_cancels_its_queued_and_running_background_tasks(
    server: Server,
) -> None:
    """Issue 17, finding 8: nobody waits on a background task, so the revoke itself
    cancels them (the guarded cancel of the API: queued → cancelled, running →
    cancelling → cancelled); another client's task runs on."""
    client_id, token = agent(server)
    _, bystander = agent(server)
    body = {"model": "lmsp-test", "input": "long", "background": True, "max_output_tokens": 400}
    with (
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {bystander}"}
        ) as other,
    ):
        mine = [http.post("/v1/responses", json=body).json()["task"]["id"] for _ in range(4)]
        theirs = other.post("/v1/responses", json=body).json()["task"]["id"]
        deadline = time.monotonic() + 30
        while task_status(server, mine[0]) != "running":  # three run (LMSP_PARALLEL=3)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        statuses = {task_status(server, t) for t in mine}
        assert "queued" in statuses and "running" in statuses, statuses
        with server.client() as owner:
            revoked = owner.delete(f"/v1/clients/{client_id}").json()
        assert revoked["revoked"] is True
        assert sorted(revoked["cancelled_tasks"]) == sorted(mine)
        deadline = time.monotonic() + 30
        while any(task_status(server, t) != "cancelled" for t in mine):
            assert time.monotonic() < deadline, [task_status(server, t) for t in mine]
            time.sleep(0.05)
        assert task_status(server, theirs) in ("queued", "running")
        with server.client() as owner:
            assert owner.post(f"/v1/tasks/{theirs}/cancel").status_code == 200
            for task_id in mine:  # each log ends with the cancel, gap-free
                log = owner.get(
                    f"/v1/tasks/{task_id}/events", headers={"Accept": "application/json"}
                ).json()["data"]
                assert [e["sequence_number"] for e in log] == list(range(len(log)))
                assert log[-1]["type"] == "response.cancelled"
        check_log_invariants(open_db(server.data_dir))
