"""``/v1/webhook_endpoints`` through the in-process app: OpenAI's shapes over the same
webhooks as ``/v1/webhooks`` (each face sees the other's), refusals with nothing
written, ownership, paging, update and rotation (audited; the old secret stops at once),
and the test event (signed, answered, not a delivery)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import WebhookVerificationError

from lmsp.config import Settings
from lmsp.protocol import webhooks as wire
from lmsp.store.webhooks import SECRET_PREFIX
from tests.api.test_webhooks import (
    add_hook,
    app_client,
    deliveries,
    new_client,
    respond,
    wait_deliveries,
)
from tests.helpers import open_db
from tests.webhook_receiver import Receiver, verify

PATH = "/v1/webhook_endpoints"
URL = "http://127.0.0.1:9/hook"


@pytest.fixture
def api(settings: Settings) -> Iterator[TestClient]:
    with app_client(settings) as client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver().start()
    yield rec
    rec.stop()


def create(
    api: TestClient, url: str = URL, headers: dict[str, str] | None = None, **body: Any
) -> Any:
    body = {"name": "mine", "url": url, "event_types": ["response.completed"], **body}
    answer = api.post(PATH, json=body, headers=headers or {})
    assert answer.status_code == 201, answer.text
    return answer.json()


def stored(settings: Settings) -> int:
    with open_db(settings.data_dir) as conn:
        return int(conn.execute("SELECT count(*) FROM webhooks").fetchone()[0])


def audit_actions(settings: Settings, target: str) -> list[str]:
    with open_db(settings.data_dir) as conn:
        rows = conn.execute("SELECT action FROM audit_log WHERE target = ? ORDER BY id", (target,))
        return [r[0] for r in rows]


def test_the_shapes_and_both_faces(api: TestClient) -> None:
    made = create(api, event_types=["response.failed", "response.completed", "response.failed"])
    assert set(made) == {
        "id",
        "object",
        "created_at",
        "updated_at",
        "name",
        "url",
        "event_types",
        "signing_secret",
        "signing_secret_hint",
    }
    assert made["object"] == "webhook_endpoint" and made["id"].startswith("wh_")
    assert made["event_types"] == ["response.completed", "response.failed"]
    assert made["signing_secret"].startswith(SECRET_PREFIX)
    assert made["signing_secret_hint"] == SECRET_PREFIX + "…" + made["signing_secret"][-4:]
    assert made["updated_at"] == made["created_at"] and made["name"] == "mine"
    # the same webhook on the lmsp face, and one made there seen here
    lmsp = api.get(f"/v1/webhooks/{made['id']}").json()
    assert lmsp["description"] == "mine" and lmsp["events"] == made["event_types"]
    other = add_hook(api, URL + "?x")  # no description: an empty name here
    seen = api.get(f"{PATH}/{other['id']}").json()
    assert seen["name"] == "" and seen["event_types"] == list(wire.EVENTS)
    assert "signing_secret" not in seen and seen["client_id"]
    assert seen["signing_secret_hint"].endswith(other["secret"][-4:])
    listed = api.get(PATH).json()
    # newest first (a second's ties by id)
    order = [(e["created_at"], e["id"]) for e in listed["data"]]
    assert order == sorted(order, reverse=True) and len(order) == 2
    assert all("signing_secret" not in e for e in listed["data"])
    assert listed["object"] == "list" and listed["has_more"] is False
    assert api.get("/v1/webhook_event_types").json() == {
        "object": "list",
        "data": list(wire.EVENTS),
    }
    gone = api.delete(f"{PATH}/{made['id']}")
    assert gone.json() == {"id": made["id"], "object": "webhook_endpoint.deleted", "deleted": True}
    assert api.get(f"/v1/webhooks/{made['id']}").status_code == 404
    assert api.get(f"{PATH}/{made['id']}").status_code == 404
    assert api.delete(f"{PATH}/{made['id']}").status_code == 404


def test_paging(api: TestClient) -> None:
    made = [create(api, name=f"n{i}")["id"] for i in range(5)]
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = api.get(PATH, params=params).json()
        seen += [e["id"] for e in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert sorted(seen) == sorted(made) and len(seen) == 5
    assert api.get(PATH, params={"after": "wh_nope"}).json()["error"]["param"] == "after"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"event_types": ["batch.completed"]}, "event_types"),
        ({"event_types": ["response.completed", "video.failed"]}, "event_types"),
        ({"event_types": []}, "event_types"),
        ({"url": "http://169.254.169.254/latest"}, "url"),
        ({"url": "http://192.168.0.7/h"}, "url"),
        ({"headers": {}}, "headers"),
    ],
)
def test_what_lmsp_cannot_honour_is_refused_and_nothing_is_written(
    api: TestClient, settings: Settings, body: dict[str, Any], param: str
) -> None:
    full = {"name": "x", "url": URL, "event_types": ["response.completed"], **body}
    answer = api.post(PATH, json=full)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert set(answer.json()["error"]) == {"type", "code", "message", "param"}
    assert stored(settings) == 0
    # and the same on an update: the webhook is left as it was
    made = create(api)
    changed = api.post(f"{PATH}/{made['id']}", json=body)
    assert changed.status_code == 400 and changed.json()["error"]["param"] == param
    now = api.get(f"{PATH}/{made['id']}").json()
    assert {k: now[k] for k in ("url", "event_types", "updated_at")} == {
        k: made[k] for k in ("url", "event_types", "updated_at")
    }
    assert audit_actions(settings, made["id"]) == ["webhook.added"]


def test_update_and_rotate_are_audited_and_the_old_secret_stops(
    api: TestClient, settings: Settings, receiver: Receiver
) -> None:
    made = create(api, url=receiver.url)
    same = api.post(f"{PATH}/{made['id']}", json={"name": "mine"}).json()
    assert same["updated_at"] == made["updated_at"]  # nothing changed: not advanced
    new_url = receiver.url + "?moved"
    changed = api.post(
        f"{PATH}/{made['id']}",
        json={"name": "renamed", "url": new_url, "event_types": list(wire.EVENTS)},
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["name"] == "renamed" and body["url"] == new_url
    assert body["event_types"] == list(wire.EVENTS) and "signing_secret" not in body
    rotated = api.post(f"{PATH}/{made['id']}/rotate_secret")
    assert rotated.status_code == 200, rotated.text
    secret = rotated.json()["signing_secret"]
    assert (
        secret != made["signing_secret"]
        and rotated.json()["signing_secret_hint"][-4:] == (secret[-4:])
    )
    assert "signing_secret" not in api.get(f"{PATH}/{made['id']}").json()
    keep = api.post(
        f"{PATH}/{made['id']}/rotate_secret", json={"keep_old_secret_active_for_24_hours": True}
    )
    assert keep.status_code == 400
    assert keep.json()["error"]["param"] == "keep_old_secret_active_for_24_hours"
    with open_db(settings.data_dir) as conn:
        rows = conn.execute(
            "SELECT action, change FROM audit_log WHERE target = ? ORDER BY id", (made["id"],)
        ).fetchall()
    assert [r[0] for r in rows] == ["webhook.added", "webhook.updated", "webhook.secret_rotated"]
    assert json.loads(rows[1][1]) == {
        "description": "renamed",
        "url": new_url,
        "events": list(wire.EVENTS),
    }
    assert secret not in rows[2][1] and made["signing_secret"] not in rows[2][1]
    # the next delivery: to the new URL, signed with the new secret only
    respond(api)
    receiver.wait_for(lambda got: len(got) >= 1)
    (delivery,) = receiver.received()
    assert delivery.path.endswith("?moved")
    verify(delivery, secret)
    with pytest.raises(WebhookVerificationError):
        verify(delivery, made["signing_secret"])


def test_another_clients_webhook_is_404_on_every_verb(api: TestClient) -> None:
    alice, bob = new_client(api, "alice"), new_client(api, "bob")
    theirs = create(api, headers=bob)
    target = f"{PATH}/{theirs['id']}"
    for method, path, body in [
        ("GET", target, None),
        ("POST", target, {"name": "mine now"}),
        ("DELETE", target, None),
        ("POST", target + "/rotate_secret", {}),
        ("POST", target + "/test", {"event_type": "response.completed"}),
    ]:
        answer = api.request(method, path, json=body, headers=alice)
        assert answer.status_code == 404, (method, path, answer.text)
    assert api.get(PATH, headers=alice).json()["data"] == []
    bobs = api.get(target, headers=bob).json()
    assert bobs["name"] == "mine" and "client_id" not in bobs  # not told its own id
    cursor = api.get(PATH, params={"after": theirs["id"]}, headers=alice)
    assert cursor.status_code == 400


def test_a_test_event_is_signed_and_answered_but_not_a_delivery(
    api: TestClient, settings: Settings
) -> None:
    teapot = Receiver(refuse=1).start()  # answers 503 first, then 200
    try:
        made = create(api, url=teapot.url)
        # not accepted: 400, and the operator (an admin client) is told what it answered
        first = api.post(f"{PATH}/{made['id']}/test", json={"event_type": "response.failed"})
        assert first.status_code == 400, first.text
        assert first.json()["error"]["code"] == "webhook_unreachable"
        assert "it answered 503" in first.json()["error"]["message"]
        again = api.post(f"{PATH}/{made['id']}/test", json={"event_type": "response.completed"})
        assert again.status_code == 429, again.text  # one test a second per webhook
        assert again.json()["error"]["code"] == "rate_limit_exceeded"
        time.sleep(float(again.headers["Retry-After"]))
        second = api.post(f"{PATH}/{made['id']}/test", json={"event_type": "response.completed"})
        assert second.json() == {
            "object": "webhook_endpoint.test",
            "webhook_endpoint_id": made["id"],
            "event_type": "response.completed",
            "status_code": 200,
            "success": True,
        }
        sent = teapot.received()
        assert len(sent) == 2  # the 503 was not tried again
        event = verify(sent[1], made["signing_secret"])
        assert event["type"] == "response.completed" and event["data"] == {"id": "resp_test"}
        assert sent[0].webhook_id != sent[1].webhook_id
        assert deliveries(api, made["id"]) == []
        with open_db(settings.data_dir) as conn:
            assert conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone()[0] == 0
        bad = api.post(f"{PATH}/{made['id']}/test", json={"event_type": "batch.completed"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "event_type"
    finally:
        teapot.stop()
    # nobody listening: no status to report
    time.sleep(1.0)
    down = api.post(f"{PATH}/{made['id']}/test", json={"event_type": "response.completed"})
    assert down.status_code == 400, down.text
    assert down.json()["error"]["code"] == "webhook_unreachable"
    assert wait_deliveries(api, made["id"], lambda r: r == []) == []
