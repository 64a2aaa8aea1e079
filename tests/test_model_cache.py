"""The model records creates resolve are kept in the API process
(:mod:`lmsp.app.model_cache`): a removed or changed model is seen by the next create,
and no create commits under a record that changed before its write."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from lmsp.app import toolcheck
from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.protocol.request import CreateRequest
from lmsp.store import clients as client_store
from tests.helpers import served
from tests.pgcluster import Cluster
from tests.test_scale_out import client as node_client
from tests.test_scale_out import node

NAME = "cached-name"


def test_a_changed_or_removed_model_is_seen_by_the_next_create(tmp_path: Path) -> None:
    with served(tmp_path / "data") as server, server.client() as http:

        def create() -> httpx.Response:
            return http.post(
                "/v1/responses", json={"model": NAME, "input": "hi", "background": True}
            )

        assert http.put(f"/v1/model_aliases/{NAME}", json={"model": "lmsp-test"}).status_code == 200
        first = create()
        assert first.status_code == 202, first.text
        assert first.json()["model"] == "lmsp-test"
        assert first.json()["temperature"] == 1.0
        changed = http.patch("/v1/models/lmsp-test", json={"defaults": {"temperature": 0.3}})
        assert changed.status_code == 200, changed.text
        assert create().json()["temperature"] == 0.3
        http.patch("/v1/models/lmsp-test", json={"defaults": {"temperature": 0.7}})
        assert create().json()["temperature"] == 0.7
        assert http.delete(f"/v1/model_aliases/{NAME}").status_code == 200
        gone = create()
        assert gone.status_code == 404, gone.text
        assert gone.json()["error"]["code"] == "model_not_found"
        assert http.put(f"/v1/model_aliases/{NAME}", json={"model": "lmsp-test"}).status_code == 200
        assert create().status_code == 202


def test_a_create_reads_its_model_once_while_nothing_changes(
    client: TestClient, settings: Settings
) -> None:
    cache = client.app.state.lmsp.model_cache  # type: ignore[attr-defined]
    body = {"model": "lmsp-test", "input": "hi", "background": True}
    for _ in range(3):
        assert client.post("/v1/responses", json=body).status_code == 202
    assert (cache.misses, cache.hits) == (1, 2)
    client.patch("/v1/models/lmsp-test", json={"defaults": {"top_k": 5}})
    assert client.post("/v1/responses", json=body).json()["top_k"] == 5
    assert cache.misses == 2


def test_a_model_changed_before_the_write_prepares_the_create_again(
    svc: Service, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another node (here: another connection to the file, which this process's
    triggers do not see) changes the model's defaults while a create is prepared: its
    transaction finds the row changed and the create is prepared again, so it runs with
    the defaults the database holds at its commit (before: with the ones read first)."""
    check = toolcheck.check_grammar
    changes = iter([0.25])

    async def changing(*args: Any, **kwargs: Any) -> Any:
        value = next(changes, None)
        if value is not None:
            other = sqlite3.connect(settings.db_path)
            with other:
                other.execute(
                    "UPDATE models SET defaults = ? WHERE id = 'lmsp-test'",
                    (json.dumps({"temperature": value}),),
                )
            other.close()
        return await check(*args, **kwargs)

    monkeypatch.setattr(toolcheck, "check_grammar", changing)
    token = (settings.data_dir / "owner.token").read_text().strip()
    client = client_store.authenticate(svc.db.reader(), token)
    assert client is not None
    given = CreateRequest(model="lmsp-test", given="hi", background=True, seed=1)

    async def main() -> Any:
        created = await svc.create(client, given, None)
        return svc.response_object(created.task_id)

    shown = asyncio.run(main())
    assert shown["temperature"] == 0.25


@pytest.mark.slow
def test_a_model_changed_on_another_node_is_seen_by_the_next_create(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    """Two nodes share a PostgreSQL database: a change made through one is heard by no
    cache of the other, yet the other's next create runs under it (its transaction
    finds the row changed and prepares it again)."""
    url = pg_cluster.database()
    a, b = (node(tmp_path, url, name, "0") for name in ("a", "b"))
    a.start()
    b.start()
    try:
        with node_client(a, a.token) as on_a, node_client(b, a.token) as on_b:
            body = {"model": NAME, "input": "hi", "background": True}
            assert on_a.put(f"/v1/model_aliases/{NAME}", json={"model": "lmsp-test"}).is_success
            assert on_b.post("/v1/responses", json=body).json()["temperature"] == 1.0
            on_a.patch("/v1/models/lmsp-test", json={"defaults": {"temperature": 0.4}})
            assert on_b.post("/v1/responses", json=body).json()["temperature"] == 0.4
            assert on_a.delete(f"/v1/model_aliases/{NAME}").is_success
            gone = on_b.post("/v1/responses", json=body)
            assert gone.status_code == 404, gone.text
    finally:
        b.stop()
        a.stop()
