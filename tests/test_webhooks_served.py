"""Webhooks through real ``lmsp serve`` processes and a real receiver (issue 25, part 1):
refused twice then accepted (one ``webhook-id``, every try verified by
``standardwebhooks`` and by ``openai``'s ``client.webhooks.unwrap``; not sent again once
accepted) with the bundled model; ``kill -9`` while the receiver is down, then the same
event delivered after the restart; two clients, each hearing only its own; URLs refused
with nothing stored; and two PostgreSQL nodes delivering each event exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.protocol import webhooks as wire
from tests.helpers import Server, open_db, seeded_data_dir
from tests.pgcluster import Cluster
from tests.webhook_receiver import Receiver, verify

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
FAST = {"LMSP_WEBHOOK_RETRY": "0.2s"}


def add_hook(http: httpx.Client, url: str, **body: Any) -> dict[str, Any]:
    body.setdefault("events", list(wire.EVENTS))
    answer = http.post("/v1/webhooks", json={"url": url, **body})
    assert answer.status_code == 201, answer.text
    hook: dict[str, Any] = answer.json()
    return hook


def deliveries(http: httpx.Client, hook_id: str) -> list[dict[str, Any]]:
    answer = http.get(f"/v1/webhooks/{hook_id}/deliveries", params={"limit": 100})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def wait_rows(http: httpx.Client, hook_id: str, done: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        rows = deliveries(http, hook_id)
        if done(rows):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)


@pytest.fixture
def data_dir(tmp_path: Path, blob_cache: Path) -> Path:
    return seeded_data_dir(tmp_path / "data", blob_cache)


def test_refused_twice_then_accepted_once_with_the_real_model(data_dir: Path) -> None:
    receiver = Receiver(refuse=2).start()
    server = Server(data_dir, env=FAST).start()
    try:
        with server.client(timeout=300) as http:
            hook = add_hook(http, receiver.url)
            answer = http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "Say hello.", "max_output_tokens": 8},
            )
            assert answer.status_code == 200, answer.text
            response = answer.json()
            receiver.wait_for(lambda got: any(d.answered == 200 for d in got))
            first = receiver.received()
            assert [d.answered for d in first] == [503, 503, 200]
            assert len({d.webhook_id for d in first}) == 1
            for delivery in first:
                event = verify(delivery, hook["secret"])
                assert event["type"] == f"response.{response['status']}"
                assert event["data"] == {"id": response["id"]}
            rows = wait_rows(http, hook["id"], lambda r: r[0]["status"] == "delivered")
            assert rows[0]["id"] == first[0].webhook_id and rows[0]["attempts"] == 3
            # a later event goes out after it: the accepted one was not sent again
            later = http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "And goodbye.", "max_output_tokens": 4},
            ).json()
            receiver.wait_for(
                lambda got: any(json.loads(d.body)["data"]["id"] == later["id"] for d in got)
            )
            wait_rows(http, hook["id"], lambda r: all(x["status"] == "delivered" for x in r))
            again = [d for d in receiver.received() if d.webhook_id == first[0].webhook_id]
            assert len(again) == 3
    finally:
        server.stop()
        receiver.stop()


def test_kill_9_while_the_receiver_is_down(data_dir: Path) -> None:
    receiver = Receiver()  # not listening yet: every try is refused
    server = Server(data_dir, env=FAST).start()
    try:
        with server.client() as http:
            hook = add_hook(http, receiver.url)
            response = http.post("/v1/responses", json={"model": "lmsp-test", "input": "hi"})
            assert response.status_code == 200, response.text
            rows = wait_rows(
                http, hook["id"], lambda r: r and r[0]["attempts"] >= 2 and r[0]["last_error"]
            )
            event_id = rows[0]["id"]
            assert rows[0]["status"] == "pending"
        server.kill()  # kill -9: nothing of the shutdown runs
        with open_db(data_dir) as conn:  # the pending delivery is a row on disk
            stored = conn.execute(
                "SELECT status FROM webhook_deliveries WHERE event_id = ?", (event_id,)
            ).fetchall()
            assert [r[0] for r in stored] == ["pending"]
        receiver.start()
        server.start()
        receiver.wait_for(lambda got: any(d.answered == 200 for d in got))
        (delivery,) = receiver.received()
        assert delivery.webhook_id == event_id
        assert verify(delivery, hook["secret"])["data"]["id"] == response.json()["id"]
        with server.client() as http:
            rows = wait_rows(http, hook["id"], lambda r: r[0]["status"] == "delivered")
            assert rows[0]["id"] == event_id
    finally:
        server.stop()
        receiver.stop()


def test_two_clients_each_hear_only_their_own(data_dir: Path) -> None:
    ears = {name: Receiver().start() for name in ("alice", "bob")}
    server = Server(data_dir, env=FAST).start()
    try:
        with server.client() as owner:
            tokens = {}
            for name in ears:
                made = owner.post(
                    "/v1/clients",
                    json={"name": name, "scopes": ["responses:read", "responses:write"]},
                )
                tokens[name] = made.json()["token"]

        def as_(name: str) -> httpx.Client:
            return httpx.Client(
                base_url=server.url,
                headers={"Authorization": f"Bearer {tokens[name]}"},
                timeout=60,
            )

        with as_("alice") as alice, as_("bob") as bob:
            hooks = {
                "alice": add_hook(alice, ears["alice"].url),
                "bob": add_hook(bob, ears["bob"].url),
            }
            made = {
                name: http.post("/v1/responses", json={"model": "lmsp-test", "input": name}).json()
                for name, http in (("alice", alice), ("bob", bob))
            }
            for name, ear in ears.items():
                ear.wait_for(lambda got: len(got) >= 1)
                (delivery,) = ear.received()
                assert verify(delivery, hooks[name]["secret"])["data"]["id"] == made[name]["id"]
            # another client's webhook is 404
            bob_hook = hooks["bob"]["id"]
            assert alice.get(f"/v1/webhooks/{bob_hook}").status_code == 404
            assert alice.get(f"/v1/webhooks/{bob_hook}/deliveries").status_code == 404
            assert alice.delete(f"/v1/webhooks/{bob_hook}").status_code == 404
            # URLs outside the allowed hosts: 400, nothing stored
            for url in ("http://169.254.169.254/latest", "http://192.168.0.7/h", "file:///x"):
                refused = alice.post(
                    "/v1/webhooks", json={"url": url, "events": ["response.completed"]}
                )
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["code"] == "invalid_webhook_url"
            # bob's later response is not heard by alice
            later = bob.post("/v1/responses", json={"model": "lmsp-test", "input": "b2"}).json()
            ears["bob"].wait_for(lambda got: len(got) >= 2)
            assert later["id"] in {json.loads(d.body)["data"]["id"] for d in ears["bob"].received()}
            assert len(ears["alice"].received()) == 1
        with open_db(data_dir) as conn:
            assert conn.execute("SELECT count(*) FROM webhooks").fetchone()[0] == 2
    finally:
        server.stop()
        for ear in ears.values():
            ear.stop()


@pytest.fixture
def two_nodes(tmp_path: Path, pg_cluster: Cluster) -> Iterator[tuple[str, list[Server]]]:
    url = pg_cluster.database()
    servers: list[Server] = []
    try:
        for name in ("a", "b"):
            data_dir = tmp_path / name
            data_dir.mkdir()
            env = {**FAST, "LMSP_DATABASE_URL": url, "LMSP_NODE_ID": name}
            servers.append(Server(data_dir, env=env).start())
        yield url, servers
    finally:
        for srv in servers:
            srv.stop()


def test_two_postgresql_nodes_deliver_each_event_exactly_once(
    two_nodes: tuple[str, list[Server]],
) -> None:
    _, (a, b) = two_nodes
    receiver = Receiver().start()
    token = a.token
    try:
        clients = [
            httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            for s in (a, b)
        ]
        hook = add_hook(clients[0], receiver.url)
        made = [
            clients[i % 2]
            .post(
                "/v1/responses", json={"model": "lmsp-test", "input": f"n{i}", "background": True}
            )
            .json()["id"]
            for i in range(12)
        ]
        receiver.wait_for(lambda got: len({d.webhook_id for d in got}) >= 12)
        rows = wait_rows(
            clients[1],
            hook["id"],
            lambda r: len(r) == 12 and all(x["status"] == "delivered" for x in r),
        )
        assert sorted(r["response_id"] for r in rows) == sorted(made)
        assert all(r["attempts"] == 1 for r in rows)  # one claim each: one node sent it
        got = receiver.received()
        assert len(got) == 12 and len({d.webhook_id for d in got}) == 12
        for delivery in got:
            verify(delivery, hook["secret"])
        for http in clients:
            http.close()
    finally:
        receiver.stop()
