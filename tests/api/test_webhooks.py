"""Webhooks through the in-process app (deterministic test engine) and a real receiver
on loopback: CRUD, the URL policy (nothing stored on a refusal), ownership, events of
every API (responses, chat completions, messages; completed, incomplete, cancelled),
signatures both official verifiers accept, retries, giving up, and the outbox row
written with the terminal state."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.config import Settings
from lmsp.protocol import webhooks as wire
from tests.helpers import open_db
from tests.webhook_receiver import Receiver, verify

FAST = {"webhook_retry": 0.05}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver().start()
    yield rec
    rec.stop()


def app_client(settings: Settings, **changes: Any) -> TestClient:
    return TestClient(create_app(dataclasses.replace(settings, **{**FAST, **changes})))


@pytest.fixture
def api(settings: Settings) -> Iterator[TestClient]:
    with app_client(settings) as client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def new_client(api: TestClient, name: str, scopes: list[str] | None = None) -> dict[str, str]:
    answer = api.post(
        "/v1/clients",
        json={"name": name, "scopes": scopes or ["responses:read", "responses:write"]},
    )
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def add_hook(api: TestClient, url: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
    body.setdefault("events", list(wire.EVENTS))
    answer = api.post("/v1/webhooks", json={"url": url, **body}, headers=headers or {})
    assert answer.status_code == 201, answer.text
    return answer.json()


def deliveries(api: TestClient, hook_id: str, headers: dict[str, str] | None = None) -> Any:
    answer = api.get(f"/v1/webhooks/{hook_id}/deliveries", headers=headers or {})
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def wait_deliveries(api: TestClient, hook_id: str, done: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        rows = deliveries(api, hook_id)
        if done(rows):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)


def respond(api: TestClient, headers: dict[str, str] | None = None, **body: Any) -> Any:
    answer = api.post(
        "/v1/responses",
        json={"model": "lmsp-test", "input": "hello", **body},
        headers=headers or {},
    )
    assert answer.status_code in (200, 202), answer.text
    return answer.json()


def test_create_list_get_delete(api: TestClient) -> None:
    hook = add_hook(api, "http://127.0.0.1:9/hook", description="mine")
    assert hook["object"] == "webhook" and hook["id"].startswith("wh_")
    assert hook["secret"].startswith("whsec_") and len(hook["secret"]) > 40
    assert hook["events"] == list(wire.EVENTS) and hook["description"] == "mine"
    shown = api.get(f"/v1/webhooks/{hook['id']}").json()
    assert "secret" not in shown and shown["url"] == "http://127.0.0.1:9/hook"
    listed = api.get("/v1/webhooks").json()
    assert [h["id"] for h in listed["data"]] == [hook["id"]]
    assert all("secret" not in h for h in listed["data"])
    assert api.delete(f"/v1/webhooks/{hook['id']}").json()["deleted"] is True
    assert api.get(f"/v1/webhooks/{hook['id']}").status_code == 404
    assert api.delete(f"/v1/webhooks/{hook['id']}").status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10:8080/hook",
        "http://172.16.0.1/hook",
        "http://example.com/hook",
        "http://user:pw@127.0.0.1/hook",
        "http:///hook",
        "not a url",
    ],
)
def test_urls_outside_the_allowed_hosts_are_refused_and_nothing_is_stored(
    api: TestClient, settings: Settings, url: str
) -> None:
    answer = api.post("/v1/webhooks", json={"url": url, "events": ["response.completed"]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_webhook_url" and error["param"] == "url"
    with open_db(settings.data_dir) as conn:
        assert conn.execute("SELECT count(*) FROM webhooks").fetchone()[0] == 0


def test_bad_bodies_are_refused(api: TestClient) -> None:
    url = "http://127.0.0.1:9/hook"
    unknown = api.post("/v1/webhooks", json={"url": url, "events": ["batch.completed"]})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "events.0"
    extra = api.post(
        "/v1/webhooks", json={"url": url, "events": ["response.failed"], "headers": {}}
    )
    assert extra.status_code == 400
    assert extra.json()["error"]["code"] == "unsupported_parameter"
    assert extra.json()["error"]["param"] == "headers"
    none = api.post("/v1/webhooks", json={"url": url, "events": []})
    assert none.status_code == 400 and none.json()["error"]["param"] == "events"


def test_webhook_hosts_widen_the_policy(settings: Settings) -> None:
    with app_client(settings, webhook_hosts="10.0.0.5:9000, hooks.example") as api:
        api.headers["Authorization"] = "Bearer " + settings.owner_token_path.read_text().strip()
        body = {"events": ["response.completed"]}
        ok = api.post("/v1/webhooks", json={"url": "http://10.0.0.5:9000/h", **body})
        assert ok.status_code == 201, ok.text
        other_port = api.post("/v1/webhooks", json={"url": "http://10.0.0.5:9001/h", **body})
        assert other_port.json()["error"]["code"] == "invalid_webhook_url"
        named = api.post("/v1/webhooks", json={"url": "https://hooks.example/x", **body})
        assert named.status_code == 201
    rules = wire.parse_hosts("*")
    assert wire.check_url("https://anything.example/x", rules)
    with pytest.raises(wire.InvalidUrl):
        wire.check_url("http://169.254.169.254/", rules)  # only an exact entry allows it
    assert wire.check_url("http://169.254.169.254/", wire.parse_hosts("169.254.169.254"))
    with pytest.raises(ValueError):
        wire.parse_hosts("http://x/y")


def test_a_completed_response_is_delivered_signed(
    api: TestClient, receiver: Receiver, settings: Settings
) -> None:
    hook = add_hook(api, receiver.url)
    response = respond(api)
    receiver.wait_for(lambda got: len(got) >= 1)
    (delivery,) = receiver.received()
    event = verify(delivery, hook["secret"])
    assert event["object"] == "event" and event["type"] == "response.completed"
    assert event["data"] == {"id": response["id"]}
    assert event["id"].startswith("evt_") and isinstance(event["created_at"], int)
    rows = wait_deliveries(api, hook["id"], lambda r: r and r[0]["status"] == "delivered")
    assert rows[0]["id"] == event["id"] and rows[0]["attempts"] == 1
    assert rows[0]["last_status_code"] == 200 and rows[0]["response_id"] == response["id"]
    # the outbox row was written by the transaction that finished the task
    with open_db(settings.data_dir) as conn:
        row = conn.execute(
            "SELECT d.created_at, t.finished_at FROM webhook_deliveries d"
            " JOIN tasks t ON t.response_id = d.response_id"
        ).fetchone()
        assert int(row[0]) <= row[1] + 1


def test_every_api_and_every_end_is_announced(
    api: TestClient, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = add_hook(api, receiver.url)
    chat = api.post(
        "/v1/chat/completions",
        json={"model": "lmsp-test", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat.status_code == 200, chat.text
    message = api.post(
        "/v1/messages",
        json={
            "model": "lmsp-test",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert message.status_code == 200, message.text
    short = respond(api, max_output_tokens=1)
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.2")  # still running when cancelled
    queued = respond(api, background=True, input="x " * 10)
    assert api.post(f"/v1/responses/{queued['id']}/cancel").status_code == 200
    receiver.wait_for(lambda got: len(got) >= 4)
    seen = {
        verify(d, hook["secret"])["data"]["id"]: json.loads(d.body)["type"]
        for d in receiver.received()
    }
    assert seen[chat.json()["id"]] == "response.completed"
    assert seen[message.json()["id"]] == "response.completed"
    assert seen[short["id"]] == "response.incomplete"
    assert seen[queued["id"]] == "response.cancelled"
    assert api.get(f"/v1/responses/{queued['id']}").json()["status"] == "cancelled"


def test_only_the_events_asked_for(api: TestClient, receiver: Receiver) -> None:
    failed_only = add_hook(api, receiver.url, events=["response.failed"])
    everything = add_hook(api, receiver.url + "?all")
    first = respond(api)
    respond(api, max_output_tokens=1)
    # both delivered, not only queued: the receiver has them (a queued row comes first)
    wait_deliveries(
        api, everything["id"], lambda r: len(r) == 2 and {d["status"] for d in r} == {"delivered"}
    )
    assert deliveries(api, failed_only["id"]) == []
    assert {json.loads(d.body)["data"]["id"] for d in receiver.received()} >= {first["id"]}


def test_refusals_are_retried_under_one_id(settings: Settings) -> None:
    receiver = Receiver(refuse=2).start()
    try:
        with app_client(settings) as api:
            api.headers["Authorization"] = "Bearer " + settings.owner_token_path.read_text()
            hook = add_hook(api, receiver.url)
            respond(api)
            receiver.wait_for(lambda got: len(got) >= 3)
            got = receiver.received()
            assert [d.answered for d in got] == [503, 503, 200]
            assert len({d.webhook_id for d in got}) == 1
            for delivery in got:
                verify(delivery, hook["secret"])
            rows = wait_deliveries(api, hook["id"], lambda r: r[0]["status"] == "delivered")
            assert rows[0]["attempts"] == 3 and rows[0]["next_attempt_at"] is None
    finally:
        receiver.stop()


def test_a_delivery_that_never_succeeds_fails_after_the_give_up_time(
    settings: Settings,
) -> None:
    receiver = Receiver(refuse=10**6).start()
    try:
        with app_client(settings, webhook_give_up=0.5) as api:
            api.headers["Authorization"] = "Bearer " + settings.owner_token_path.read_text()
            hook = add_hook(api, receiver.url)
            respond(api)
            rows = wait_deliveries(api, hook["id"], lambda r: r and r[0]["status"] == "failed")
            assert rows[0]["attempts"] >= 2 and rows[0]["last_error"] == "HTTP 503"
            tries = len(receiver.received())
            respond(api)  # a later event is tried: the failed one is not tried again
            wait_deliveries(api, hook["id"], lambda r: len(r) == 2 and r[0]["attempts"] >= 1)
            failed = [d for d in receiver.received() if d.webhook_id == rows[0]["id"]]
            assert len(failed) == tries
    finally:
        receiver.stop()


def test_a_slow_receiver_blocks_neither_tasks_nor_another_receiver(api: TestClient) -> None:
    release = threading.Event()
    slow, fast = Receiver(hold=release).start(), Receiver().start()
    try:
        add_hook(api, slow.url)
        add_hook(api, fast.url)
        made = [respond(api)["id"] for _ in range(6)]  # each answered: no task waited
        fast.wait_for(lambda got: len(got) == 6)
        assert {json.loads(d.body)["data"]["id"] for d in fast.received()} == set(made)
        assert slow.received() == []  # not one answered yet
        deadline = time.monotonic() + 30
        while slow.waiting < 4:  # it holds its share of the sender (4 tries)
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert slow.waiting == 4
        release.set()
        slow.wait_for(lambda got: len(got) == 6)
    finally:
        release.set()
        slow.stop()
        fast.stop()


def test_each_client_hears_only_its_own(api: TestClient, receiver: Receiver) -> None:
    alice, bob = new_client(api, "alice"), new_client(api, "bob")
    alice_hook = add_hook(api, receiver.url + "?alice", headers=alice)
    bob_hook = add_hook(api, receiver.url + "?bob", headers=bob)
    mine = respond(api, headers=alice)
    theirs = respond(api, headers=bob)
    receiver.wait_for(lambda got: len(got) >= 2)
    for delivery in receiver.received():  # each signed with its own webhook's secret
        own = alice_hook if delivery.path.endswith("?alice") else bob_hook
        expected = mine if own is alice_hook else theirs
        assert verify(delivery, own["secret"])["data"]["id"] == expected["id"]
    alice_rows = deliveries(api, alice_hook["id"], alice)
    bob_rows = deliveries(api, bob_hook["id"], bob)
    assert [r["response_id"] for r in alice_rows] == [mine["id"]]
    assert [r["response_id"] for r in bob_rows] == [theirs["id"]]
    # another client's webhook is 404, for every verb
    for path in (f"/v1/webhooks/{bob_hook['id']}", f"/v1/webhooks/{bob_hook['id']}/deliveries"):
        assert api.get(path, headers=alice).status_code == 404
    assert api.delete(f"/v1/webhooks/{bob_hook['id']}", headers=alice).status_code == 404
    assert [h["id"] for h in api.get("/v1/webhooks", headers=alice).json()["data"]] == [
        alice_hook["id"]
    ]
    # only admin may hear every client's
    refused = api.post(
        "/v1/webhooks",
        json={"url": receiver.url, "events": ["response.completed"], "all_clients": True},
        headers=alice,
    )
    assert refused.status_code == 403
    overseer = add_hook(api, receiver.url + "?owner", all_clients=True)
    respond(api, headers=bob)
    wait_deliveries(api, overseer["id"], lambda r: len(r) == 1)
    assert len(api.get("/v1/webhooks").json()["data"]) == 3  # admin sees every client's


def test_scopes(api: TestClient) -> None:
    reader = new_client(api, "reader", ["responses:read"])
    assert api.get("/v1/webhooks", headers=reader).status_code == 200
    denied = api.post(
        "/v1/webhooks",
        json={"url": "http://127.0.0.1:9/", "events": ["response.completed"]},
        headers=reader,
    )
    assert denied.status_code == 403
    assert api.get("/v1/webhooks", headers={"Authorization": "Bearer nope"}).status_code == 401
