"""The pairing device flow over HTTP (in process): approve, narrow, deny, expire, claim
exactly once, the pending limit, and retention of expired requests."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.runner.retention import sweep
from lmsp.store import pairing


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient]:
    """The app with no default token and a small pending limit."""
    with TestClient(create_app(dataclasses.replace(settings, max_pending_pairings=3))) as c:
        yield c


def owner(settings: Settings) -> dict[str, str]:
    token = (settings.data_dir / "owner.token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def svc_of(http: TestClient) -> Service:
    service: Service = http.app.state.lmsp  # type: ignore[attr-defined]
    return service


def expire(http: TestClient, pair_id: str, seconds_ago: int = 1) -> None:
    svc_of(http).db.write_sync(
        lambda c: c.execute(
            "UPDATE pairing_requests SET expires_at = strftime('%s','now') - ? WHERE id = ?",
            (seconds_ago, pair_id),
        )
    )


def poll(http: TestClient, pair_id: str) -> tuple[int, str]:
    answer = http.post(f"/v1/pairing/{pair_id}/token")
    body = answer.json()
    return answer.status_code, body["error"]["code"] if "error" in body else body["token"]


def test_request_approve_and_claim_exactly_once(http: TestClient, settings: Settings) -> None:
    made = http.post(
        "/v1/pairing",
        json={"client_name": "agent-7", "scopes": ["responses:read", "responses:write"]},
    )
    assert made.status_code == 201
    request = made.json()
    assert request["id"].startswith("pair_") and request["interval"] == 2
    assert re.fullmatch(r"[A-Z]{4}-[A-Z]{4}", request["user_code"])
    assert request["expires_at"] - request["created_at"] == 600
    assert poll(http, request["id"]) == (400, "authorization_pending")
    listed = http.get("/v1/pairing", headers=owner(settings)).json()["data"]
    assert [p["user_code"] for p in listed] == [request["user_code"]]

    code = request["user_code"].lower().replace("-", "")  # as typed by a person
    approved = http.post(
        f"/v1/pairing/{code}/approve", json={"scopes": ["responses:read"]}, headers=owner(settings)
    )
    assert approved.status_code == 200 and approved.json()["granted_scopes"] == ["responses:read"]
    assert http.get("/v1/pairing", headers=owner(settings)).json()["data"] == []

    claimed = http.post(f"/v1/pairing/{request['id']}/token")
    assert claimed.status_code == 200
    grant = claimed.json()
    assert set(grant) == {"client_id", "token", "scopes"}
    assert grant["scopes"] == ["responses:read"] and grant["token"].startswith("lmsp_")
    assert poll(http, request["id"]) == (400, "already_claimed")

    agent = {"Authorization": f"Bearer {grant['token']}"}
    assert http.get("/v1/tasks", headers=agent).status_code == 200
    narrowed = http.post("/v1/responses", json={"model": "lmsp-test", "input": "x"}, headers=agent)
    assert narrowed.status_code == 403
    clients = http.get("/v1/clients", headers=owner(settings)).json()["data"]
    assert [c["name"] for c in clients if c["id"] == grant["client_id"]] == ["agent-7"]


def test_deny_answers_access_denied(http: TestClient, settings: Settings) -> None:
    request = http.post("/v1/pairing", json={"client_name": "intruder"}).json()
    denied = http.post(f"/v1/pairing/{request['user_code']}/deny", headers=owner(settings))
    assert denied.status_code == 200 and denied.json()["status"] == "denied"
    assert poll(http, request["id"]) == (400, "access_denied")
    again = http.post(f"/v1/pairing/{request['id']}/approve", headers=owner(settings))
    assert again.status_code == 409 and again.json()["error"]["code"] == "pairing_not_pending"
    assert len(http.get("/v1/clients", headers=owner(settings)).json()["data"]) == 1


def test_an_expired_request_can_be_neither_approved_nor_claimed(
    http: TestClient, settings: Settings
) -> None:
    pending = http.post("/v1/pairing", json={"client_name": "slow"}).json()
    approved = http.post("/v1/pairing", json={"client_name": "late"}).json()
    http.post(f"/v1/pairing/{approved['id']}/approve", headers=owner(settings))
    expire(http, pending["id"])
    expire(http, approved["id"])
    assert poll(http, pending["id"]) == (400, "expired_token")
    assert poll(http, approved["id"]) == (400, "expired_token")
    late = http.post(f"/v1/pairing/{pending['id']}/approve", headers=owner(settings))
    assert late.status_code == 409 and late.json()["error"]["code"] == "pairing_expired"
    assert http.get("/v1/pairing", headers=owner(settings)).json()["data"] == []


def test_retention_deletes_expired_requests_after_the_grace_period(
    http: TestClient, settings: Settings
) -> None:
    recent = http.post("/v1/pairing", json={"client_name": "a"}).json()
    old = http.post("/v1/pairing", json={"client_name": "b"}).json()
    live = http.post("/v1/pairing", json={"client_name": "c"}).json()
    expire(http, recent["id"], 10)
    expire(http, old["id"], pairing.GRACE + 10)
    swept = sweep(svc_of(http).db, settings.retention)
    assert swept.pairing_requests == 1
    assert poll(http, old["id"])[0] == 404
    assert poll(http, recent["id"]) == (400, "expired_token")
    assert poll(http, live["id"]) == (400, "authorization_pending")


def test_pending_requests_are_limited(http: TestClient, settings: Settings) -> None:
    made = [http.post("/v1/pairing", json={"client_name": f"n{i}"}) for i in range(3)]
    assert [m.status_code for m in made] == [201, 201, 201]
    refused = http.post("/v1/pairing", json={"client_name": "one too many"})
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused.headers["retry-after"]) <= 600
    http.post(f"/v1/pairing/{made[0].json()['id']}/deny", headers=owner(settings))
    assert http.post("/v1/pairing", json={"client_name": "room again"}).status_code == 201


def test_invalid_requests_and_decisions(http: TestClient, settings: Settings) -> None:
    bad = http.post("/v1/pairing", json={"client_name": "x", "scopes": ["root"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("scopes")
    assert http.post("/v1/pairing", json={"client_name": ""}).status_code == 400
    request = http.post(
        "/v1/pairing", json={"client_name": "x", "scopes": ["responses:read"]}
    ).json()
    wider = http.post(
        f"/v1/pairing/{request['id']}/approve",
        json={"scopes": ["admin"]},
        headers=owner(settings),
    )
    assert wider.status_code == 400 and wider.json()["error"]["code"] == "invalid_scope"
    assert http.post("/v1/pairing/pair_nope/approve", headers=owner(settings)).status_code == 404
    assert http.post("/v1/pairing/pair_nope/token").status_code == 404
