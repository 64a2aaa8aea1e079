"""The console's session over HTTP (in process): a login code spent once for a secret
that works only in its header, never as a cookie; sign-out, expiry and a revoke end it."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from lmsp.api import sessions
from lmsp.api.state import Http


def http_of(client: TestClient) -> Http:
    kept: Http = client.app.state.http  # type: ignore[attr-defined]
    return kept


def sign_in(client: TestClient, bearer: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    link = client.post("/v1/console/links", headers=headers).json()["url"]
    path, _, code = link.partition("#code=")
    assert path.endswith("/console/login") and code
    made = client.post("/console/session", json={"code": code}, headers={"Authorization": ""})
    assert made.status_code == 201 and "set-cookie" not in made.headers
    assert made.headers["cache-control"] == "no-store"
    again = client.post("/console/session", json={"code": code}, headers={"Authorization": ""})
    assert again.status_code == 401  # once only
    secret: str = made.json()["secret"]
    return secret


def test_the_secret_works_in_its_header_only(client: TestClient) -> None:
    secret = sign_in(client)
    anonymous = {"Authorization": ""}
    header = {**anonymous, "X-Lmsp-Session": secret}
    who = client.get("/console/session", headers=header).json()
    assert who["name"] == "owner" and "secret" not in who
    assert client.get("/v1/clients", headers=header).status_code == 200
    made = client.post(
        "/v1/clients", json={"name": "from-console", "scopes": ["models:read"]}, headers=header
    )
    assert made.status_code == 201  # no CSRF token: the header is the proof
    # as a cookie (what the old console used) or a bearer token, it is nothing
    client.cookies.set("lmsp_console", secret)
    assert client.get("/v1/clients", headers=anonymous).status_code == 401
    client.cookies.clear()
    assert (
        client.get("/v1/clients", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    )
    assert client.get("/console/login").status_code == 200  # the page, which spends the code


def test_sign_out_and_expiry_end_a_session(client: TestClient) -> None:
    first, second = sign_in(client), sign_in(client)
    ended = client.delete("/console/session", headers={"Authorization": "", sessions.HEADER: first})
    assert ended.status_code == 200
    assert (
        client.get("/v1/clients", headers={"Authorization": "", sessions.HEADER: first}).status_code
        == 401
    )
    live = {"Authorization": "", sessions.HEADER: second}
    assert client.get("/v1/clients", headers=live).status_code == 200
    later = time.time() + sessions.SESSION_TTL + 1
    assert http_of(client).console.session(second, now=later) is None  # expired: dropped
    assert client.get("/v1/clients", headers=live).status_code == 401


def test_a_revoked_clients_session_ends(client: TestClient) -> None:
    admin = client.post("/v1/clients", json={"name": "ops", "scopes": ["admin"]}).json()
    secret = sign_in(client, admin["token"])
    header = {"Authorization": "", sessions.HEADER: secret}
    assert client.get("/console/session", headers=header).json()["name"] == "ops"
    assert client.delete(f"/v1/clients/{admin['id']}").status_code == 200
    assert client.get("/v1/clients", headers=header).status_code == 401
