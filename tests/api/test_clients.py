"""``/v1/clients``: create (token shown once), list, revoke; ``last_used_at``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.app.service import Service
from lmsp.store import clients


def svc_of(client: TestClient) -> Service:
    service: Service = client.app.state.lmsp  # type: ignore[attr-defined]
    return service


def test_create_list_and_revoke(client: TestClient) -> None:
    made = client.post(
        "/v1/clients", json={"name": "ci", "scopes": ["responses:write", "responses:read"]}
    )
    assert made.status_code == 201
    created = made.json()
    token = created["token"]
    assert token.startswith("lmsp_") and len(token) >= 5 + 43
    assert created["token_prefix"] == token[:11]
    assert created["scopes"] == ["responses:read", "responses:write"]
    listed = client.get("/v1/clients").json()["data"]
    assert {c["name"] for c in listed} == {"owner", "ci"}
    assert all("token" not in c and "token_hash" not in c for c in listed)

    agent = {"Authorization": f"Bearer {token}"}
    task = client.post(
        "/v1/responses",
        json={"model": "lmsp-test", "input": "x", "background": True},
        headers=agent,
    ).json()
    wait_status_as(client, agent, task["id"])
    revoked = client.delete(f"/v1/clients/{created['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert client.get("/v1/tasks", headers=agent).status_code == 401
    # its tasks stay
    conn = svc_of(client).db.reader()
    assert (
        conn.execute("SELECT count(*) FROM tasks WHERE client_id = ?", (created["id"],)).fetchone()[
            0
        ]
        == 1
    )
    again = client.delete(f"/v1/clients/{created['id']}")
    assert again.status_code == 200
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    assert client.delete("/v1/clients/cli_missing").status_code == 404


def wait_status_as(client: TestClient, headers: dict[str, str], response_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            client.get(f"/v1/responses/{response_id}", headers=headers).json()["status"]
            == "completed"
        ):
            return
        time.sleep(0.01)
    raise AssertionError("never completed")


def test_the_owner_cannot_be_revoked(client: TestClient) -> None:
    owner = next(c for c in client.get("/v1/clients").json()["data"] if c["name"] == "owner")
    refused = client.delete(f"/v1/clients/{owner['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "owner_client"
    assert client.get("/v1/clients").status_code == 200


def test_invalid_bodies(client: TestClient) -> None:
    assert client.post("/v1/clients", json={"name": "x", "scopes": []}).status_code == 400
    bad = client.post("/v1/clients", json={"name": "x", "scopes": ["everything"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("scopes")


def test_last_used_at_is_kept_at_most_once_a_minute(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = client.post("/v1/clients", json={"name": "u", "scopes": ["models:read"]}).json()
    agent = {"Authorization": f"Bearer {made['token']}"}
    svc = svc_of(client)
    assert made["last_used_at"] is None
    touches: list[str] = []  # the writes of last_used_at (other writers may commit meanwhile)
    real_touch = clients.touch

    def counted(conn: Any, client_id: str, now: int) -> bool:
        touches.append(client_id)
        return real_touch(conn, client_id, now)

    monkeypatch.setattr(clients, "touch", counted)
    for _ in range(5):
        assert client.get("/v1/models", headers=agent).status_code == 200
    assert touches == [made["id"]]  # one touch, not five
    row = clients.get(svc.db.reader(), made["id"])
    assert row is not None and row["last_used_at"] is not None
    stamp = row["last_used_at"]
    # a minute later the next request records the use again
    svc.db.write_sync(
        lambda c: c.execute(
            "UPDATE clients SET last_used_at = ? WHERE id = ?", (stamp - 61, made["id"])
        )
    )
    svc.touched.clear()
    client.get("/v1/models", headers=agent)
    row = clients.get(svc.db.reader(), made["id"])
    assert row is not None and row["last_used_at"] >= stamp
