"""``/v1/responses`` and ``/v1/tasks`` end to end through the in-process app."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from fastapi.testclient import TestClient

from lmsp.protocol import events as ev
from lmsp.store import tasks as task_store
from tests.helpers import check_log_invariants

BODY = {"model": "lmsp-test", "input": "hello there", "seed": 11}


def sse_events(
    client: TestClient, method: str, url: str, done: bool = True, **kwargs: Any
) -> list[dict[str, Any]]:
    """The events of a stream, checking its framing: ``\n`` line endings, ``event:`` =
    ``type``, ``id:`` = ``sequence_number``, and (``done``: a responses stream)
    ``data: [DONE]`` last."""
    with client.stream(method, url, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read()
    assert b"\r" not in raw
    blocks = [b for b in raw.decode().split("\n\n") if b.strip()]
    if done:
        assert blocks.pop() == "data: [DONE]"
    events = []
    for block in blocks:
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        event = json.loads(fields["data"])
        assert fields["event"] == event["type"]
        assert int(fields["id"]) == event["sequence_number"]
        events.append(event)
    return events


def after(events: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
    return [e for e in events if e["sequence_number"] > seq]


def wait_status(client: TestClient, response_id: str, *statuses: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        obj = client.get(f"/v1/responses/{response_id}").json()
        if obj["status"] in statuses:
            return obj  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError(f"{response_id} never reached {statuses}")


def text_of(obj: dict[str, Any]) -> str:
    return "".join(c["text"] for item in obj["output"] for c in item["content"])


def test_sync_create_answers_the_final_object(client: TestClient) -> None:
    response = client.post("/v1/responses", json=BODY)
    assert response.status_code == 200
    obj = response.json()
    assert obj["object"] == "response" and obj["id"].startswith("resp_")
    assert obj["status"] == "completed"
    assert obj["model"] == "lmsp-test"
    assert obj["model_digest"].startswith("sha256:")
    assert obj["task"]["status"] == "completed" and obj["task"]["attempt"] == 1
    assert obj["usage"]["total_tokens"] == obj["usage"]["input_tokens"] + 24
    assert text_of(obj).count(" ") == 24
    assert client.get(f"/v1/responses/{obj['id']}").json() == obj


def test_same_seed_same_text(client: TestClient) -> None:
    body = {**BODY, "temperature": 0.9}
    first = client.post("/v1/responses", json=body).json()
    second = client.post("/v1/responses", json=body).json()
    other = client.post("/v1/responses", json={**body, "seed": 12}).json()
    assert text_of(first) == text_of(second) != text_of(other)


def test_background_create_commits_before_202(client: TestClient) -> None:
    response = client.post("/v1/responses", json={**BODY, "background": True})
    assert response.status_code == 202
    obj = response.json()
    assert obj["status"] == "queued" and obj["background"] is True
    assert response.headers["location"] == f"/v1/responses/{obj['id']}"
    # the row is there for any other connection the moment the 202 is read
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    import sqlite3

    other = sqlite3.connect(str(svc.settings.db_path))
    assert other.execute(
        "SELECT count(*) FROM responses WHERE id = ?", (obj["id"],)
    ).fetchone() == (1,)
    final = wait_status(client, obj["id"], "completed")
    assert text_of(final)


def test_stream_create_gives_the_openai_event_order(client: TestClient) -> None:
    events = sse_events(client, "POST", "/v1/responses", json={**BODY, "stream": True})
    kinds = [e["type"] for e in events]
    log = client.get(
        f"/v1/tasks/{events[0]['response']['task']['id']}/events",
        headers={"Accept": "application/json"},
    ).json()["data"]
    # the log's numbers; the LMSP lifecycle extensions only in the log by default
    assert events == [e for e in log if e["type"] not in ev.LMSP_LIFECYCLE]
    assert "response.loading" in [e["type"] for e in log]
    assert set(kinds) <= ev.STANDARD
    assert kinds[0] == "response.created"
    assert kinds.index("response.output_item.added") < kinds.index("response.content_part.added")
    assert kinds.index("response.content_part.added") < kinds.index("response.output_text.delta")
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text
    assert events[-4]["text"] == text


def test_retrieve_stream_starting_after(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    all_events = sse_events(client, "GET", f"/v1/responses/{obj['id']}", params={"stream": True})
    tail = sse_events(
        client,
        "GET",
        f"/v1/responses/{obj['id']}",
        params={"stream": "true", "starting_after": 6},
    )
    assert tail == after(all_events, 6)
    resumed = sse_events(
        client,
        "GET",
        f"/v1/responses/{obj['id']}?stream=true",
        headers={"Last-Event-ID": "10"},
    )
    assert resumed == after(all_events, 10)
    whole = sse_events(
        client,
        "GET",
        f"/v1/responses/{obj['id']}",
        params={"stream": True, "include": "lmsp.lifecycle"},
    )
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert [e for e in whole if e["type"] != "response.loading"] == all_events
    past_end = sse_events(
        client, "GET", f"/v1/responses/{obj['id']}", params={"stream": True, "starting_after": 999}
    )
    assert past_end == []


def test_live_stream_follows_a_background_task(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()  # hold the queue so the stream starts before any output
    obj = client.post("/v1/responses", json={**BODY, "background": True}).json()
    result: dict[str, list[dict[str, Any]]] = {}

    def follow() -> None:
        result["events"] = sse_events(
            client,
            "GET",
            f"/v1/responses/{obj['id']}",
            params={"stream": True, "include": "lmsp.lifecycle"},
        )

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.2)
    assert svc.runner.run_next() == obj["task"]["id"]
    reader.join(30)
    events = result["events"]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_cancel_a_queued_response(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    obj = client.post("/v1/responses", json={**BODY, "background": True}).json()
    cancelled = client.post(f"/v1/responses/{obj['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    again = client.post(f"/v1/responses/{obj['id']}/cancel")
    assert again.status_code == 200 and again.json() == cancelled.json()
    events = client.get(
        f"/v1/tasks/{obj['task']['id']}/events", headers={"Accept": "application/json"}
    ).json()["data"]
    assert [e["type"] for e in events] == [
        "response.created",
        "response.queued",
        "response.cancelled",
    ]


def test_cancel_a_running_response(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    obj = client.post("/v1/responses", json={**BODY, "background": True}).json()
    task_id = obj["task"]["id"]
    svc.db.write_sync(task_store.claim_next)
    svc.db.write_sync(lambda c: task_store.start(c, task_id, None))
    cancelling = client.post(f"/v1/responses/{obj['id']}/cancel").json()
    assert cancelling["status"] == "in_progress"
    assert cancelling["task"]["status"] == "cancelling"
    assert client.delete(f"/v1/responses/{obj['id']}").status_code == 409
    svc.db.write_sync(lambda c: task_store.finish_cancel(c, task_id))
    assert client.get(f"/v1/responses/{obj['id']}").json()["status"] == "cancelled"
    check_log_invariants(svc.db.reader())


def test_cancel_on_a_finished_response_changes_nothing(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    response = client.post(f"/v1/responses/{obj['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "completed"


def test_delete_removes_response_task_and_events(client: TestClient) -> None:
    obj = client.post("/v1/responses", json=BODY).json()
    deleted = client.delete(f"/v1/responses/{obj['id']}")
    assert deleted.json() == {"id": obj["id"], "object": "response", "deleted": True}
    assert client.get(f"/v1/responses/{obj['id']}").status_code == 404
    assert client.get(f"/v1/tasks/{obj['task']['id']}").status_code == 404
    conn = client.app.state.lmsp.db.reader()  # type: ignore[attr-defined]
    assert conn.execute("SELECT count(*) FROM task_events").fetchone()[0] == 0
    assert client.delete(f"/v1/responses/{obj['id']}").status_code == 404


def test_store_false_keeps_nothing(client: TestClient) -> None:
    obj = client.post("/v1/responses", json={**BODY, "store": False}).json()
    assert obj["status"] == "completed" and text_of(obj)
    assert client.get(f"/v1/responses/{obj['id']}").status_code == 404


def test_input_messages_and_instructions(client: TestClient) -> None:
    body = {
        "model": "lmsp-test",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "?"}]},
        ],
        "metadata": {"trace": "abc"},
    }
    obj = client.post("/v1/responses", json=body).json()
    assert obj["status"] == "completed"
    assert obj["instructions"] == "be brief" and obj["metadata"] == {"trace": "abc"}


def test_engine_failure_is_reported(client: TestClient) -> None:
    obj = client.post("/v1/responses", json={**BODY, "input": "[engine-error]"}).json()
    assert obj["status"] == "failed"
    assert obj["error"]["code"] == "engine_error"


def test_idempotent_background_create_replays(client: TestClient) -> None:
    headers = {"Idempotency-Key": "order-42"}
    body = {**BODY, "background": True}
    first = client.post("/v1/responses", json=body, headers=headers)
    second = client.post("/v1/responses", json=body, headers=headers)
    assert first.status_code == second.status_code == 202
    assert second.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert first.json()["id"] == second.json()["id"]
    conn = client.app.state.lmsp.db.reader()  # type: ignore[attr-defined]
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1
    reused = client.post("/v1/responses", json={**body, "input": "other"}, headers=headers)
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1


def test_idempotent_sync_create_in_flight_gets_409(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    headers = {"Idempotency-Key": "sync-1"}
    done: dict[str, Any] = {}

    def original() -> None:
        done["response"] = client.post("/v1/responses", json=BODY, headers=headers)

    thread = threading.Thread(target=original)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if svc.db.reader().execute("SELECT count(*) FROM idempotency_keys").fetchone()[0]:
            break
        time.sleep(0.01)
    retry = client.post("/v1/responses", json=BODY, headers=headers)
    assert retry.status_code == 409
    assert retry.json()["error"]["code"] == "idempotency_request_in_progress"
    svc.runner.run_next()
    thread.join(30)
    assert done["response"].status_code == 200
    replay = client.post("/v1/responses", json=BODY, headers=headers)
    assert replay.status_code == 200
    assert replay.json() == done["response"].json()
    assert replay.headers["idempotent-replayed"] == "true"


def test_idempotency_keys_are_validated(client: TestClient) -> None:
    for bad in ["", "x" * 256, "has space", "tab\tkey"]:
        response = client.post("/v1/responses", json=BODY, headers={"Idempotency-Key": bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == "Idempotency-Key"


def test_idempotent_cancel(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    obj = client.post("/v1/responses", json={**BODY, "background": True}).json()
    headers = {"Idempotency-Key": "cancel-1"}
    first = client.post(f"/v1/responses/{obj['id']}/cancel", headers=headers)
    second = client.post(f"/v1/responses/{obj['id']}/cancel", headers=headers)
    assert first.json()["status"] == second.json()["status"] == "cancelled"
    assert second.headers["idempotent-replayed"] == "true"


def test_tasks_list_get_and_events(client: TestClient) -> None:
    created = [client.post("/v1/responses", json=BODY).json() for _ in range(3)]
    page = client.get("/v1/tasks", params={"limit": 2}).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [t["id"] for t in page["data"]] == [c["task"]["id"] for c in created[::-1][:2]]
    rest = client.get("/v1/tasks", params={"after": page["last_id"]}).json()
    assert [t["id"] for t in rest["data"]] == [created[0]["task"]["id"]]
    assert rest["has_more"] is False
    only_done = client.get("/v1/tasks", params={"status": "completed"}).json()
    assert len(only_done["data"]) == 3
    assert client.get("/v1/tasks", params={"status": "queued"}).json()["data"] == []

    task = client.get(f"/v1/tasks/{created[0]['task']['id']}").json()
    assert task["object"] == "task" and task["response_id"] == created[0]["id"]
    assert task["status"] == "completed" and task["finished_at"] is not None
    events = client.get(
        f"/v1/tasks/{task['id']}/events", headers={"Accept": "application/json"}
    ).json()
    assert [e["sequence_number"] for e in events["data"]] == list(
        range(task["last_sequence_number"] + 1)
    )
    page = client.get(
        f"/v1/tasks/{task['id']}/events",
        params={"after": 3, "limit": 2},
        headers={"Accept": "application/json"},
    ).json()
    assert [e["sequence_number"] for e in page["data"]] == [4, 5] and page["has_more"]
    # the task's log as SSE: every event, the LMSP extensions too, and no [DONE]
    streamed = sse_events(client, "GET", f"/v1/tasks/{task['id']}/events", done=False)
    assert streamed == events["data"]


def test_task_cancel_endpoint(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    obj = client.post("/v1/responses", json={**BODY, "background": True}).json()
    task = client.post(f"/v1/tasks/{obj['task']['id']}/cancel").json()
    assert task["status"] == "cancelled"
    assert client.get(f"/v1/responses/{obj['id']}").json()["status"] == "cancelled"


def test_queue_position_is_reported(client: TestClient) -> None:
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    svc.runner.pause()
    ids = [client.post("/v1/responses", json={**BODY, "background": True}).json() for _ in range(3)]
    positions = [client.get(f"/v1/tasks/{o['task']['id']}").json()["queue_position"] for o in ids]
    assert positions == [1, 2, 3]
    client.post(f"/v1/responses/{ids[0]['id']}/cancel")
    assert client.get(f"/v1/responses/{ids[2]['id']}").json()["task"]["queue_position"] == 2


def test_models_endpoints(client: TestClient) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    first = models["data"][0]
    assert first["format"] == "gguf" and first["digest"].startswith("sha256:")
    assert first["size_bytes"] > 50_000_000
    assert client.get("/v1/models/lmsp-test").json()["loaded"] in (True, False)
