"""Tokens are checked from a cache (no database read per request), and a revoke or a
changed client takes effect at the very next request."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from lmsp.api.state import Http
from lmsp.api.tokens import TokenCache
from lmsp.app.service import Service
from lmsp.store import clients
from lmsp.store.db import Database


def svc_of(client: TestClient) -> Service:
    service: Service = client.app.state.lmsp  # type: ignore[attr-defined]
    return service


def http_of(client: TestClient) -> Http:
    kept: Http = client.app.state.http  # type: ignore[attr-defined]
    return kept


def new_client(client: TestClient, scopes: list[str]) -> tuple[str, dict[str, str]]:
    made = client.post("/v1/clients", json={"name": "agent", "scopes": scopes}).json()
    return made["id"], {"Authorization": f"Bearer {made['token']}"}


def test_a_known_token_is_not_read_again(client: TestClient) -> None:
    _, agent = new_client(client, ["responses:read"])
    tokens = http_of(client).tokens
    assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404
    misses, hits = tokens.misses, tokens.hits
    for _ in range(5):
        assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404
    assert tokens.misses == misses  # no database lookup
    assert tokens.hits == hits + 5


def test_revoke_refuses_the_next_request(client: TestClient) -> None:
    client_id, agent = new_client(client, ["responses:read", "responses:write"])
    tokens = http_of(client).tokens
    for _ in range(3):
        assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404
    hits = tokens.hits
    assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404
    assert tokens.hits == hits + 1  # the token is cached now
    assert client.delete(f"/v1/clients/{client_id}").status_code == 200
    refused = client.get("/v1/responses/resp_missing", headers=agent)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_token"
    body = {"model": "lmsp-test", "input": "x", "background": True}
    assert client.post("/v1/responses", json=body, headers=agent).status_code == 401


def test_changed_scopes_are_seen_at_once(client: TestClient) -> None:
    client_id, agent = new_client(client, ["responses:read"])
    svc = svc_of(client)
    assert client.get("/v1/models", headers=agent).status_code == 403
    assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404

    def rescope(scopes: list[str]) -> None:
        svc.db.write_sync(
            lambda c: c.execute(
                "UPDATE clients SET scopes = ? WHERE id = ?", (json.dumps(scopes), client_id)
            )
        )

    rescope(["models:read"])
    assert client.get("/v1/models", headers=agent).status_code == 200
    assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 403
    rescope(["responses:read"])
    assert client.get("/v1/models", headers=agent).status_code == 403
    assert client.get("/v1/responses/resp_missing", headers=agent).status_code == 404


def test_a_new_client_works_at_once_and_a_bad_token_never_does(client: TestClient) -> None:
    bad = {"Authorization": "Bearer lmsp_" + "x" * 43}
    assert client.get("/v1/models", headers=bad).status_code == 401
    _, agent = new_client(client, ["models:read"])
    assert client.get("/v1/models", headers=agent).status_code == 200
    assert client.get("/v1/models", headers=bad).status_code == 401


def owner_and_token(db: Database) -> tuple[str, str]:
    made: Any = db.write_sync(lambda c: clients.add(c, "x", ["admin"]))
    return made[0].id, made[1]


def test_the_cache_is_bounded_and_keeps_no_token(svc: Service) -> None:
    cache = TokenCache(svc.db, size=3)
    made = [owner_and_token(svc.db) for _ in range(5)]
    for _, token in made:
        assert cache.lookup(token) is not None
    assert len(cache._entries) == 3
    assert all(token not in key for _, token in made for key in cache._entries)
    assert cache.cached(made[0][1]) is None  # evicted, oldest first
    assert cache.cached(made[4][1]) is not None


def test_a_row_read_during_an_uncommitted_change_is_not_trusted(svc: Service) -> None:
    """The race the double bump closes: a lookup that reads the old row while a revoke
    is uncommitted must not be served after the revoke commits."""
    client_id, token = owner_and_token(svc.db)
    cache = TokenCache(svc.db)
    assert cache.lookup(token) is not None

    def revoke_while_reading(conn: Any) -> None:
        clients.revoke(conn, client_id)
        # a reader thread, mid-transaction: sees the old, unrevoked row
        assert cache.lookup(token) is not None

    svc.db.write_sync(revoke_while_reading)
    assert cache.cached(token) is None
    assert cache.lookup(token) is None
