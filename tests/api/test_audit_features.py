"""The audit log (PROTOCOL.md 13) hears the owner actions of the newer features too:
webhooks added and removed, models pulled by name — in the transaction that makes them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.bootstrap import bundled_model_path
from lmsp.config import Settings
from tests.hub_standin import Hub, HubFile, serve, sha256_of

REPO = "audit/SmolLM2-GGUF"


@pytest.fixture
def api(settings: Settings) -> Iterator[TestClient]:
    bundled = bundled_model_path()
    hub = serve(
        Hub(
            REPO,
            [HubFile("smollm2-Q4_K_M.gguf", bundled, bundled.stat().st_size, sha256_of(bundled))],
        )
    )
    try:
        with TestClient(create_app(dataclasses.replace(settings, hf_endpoint=hub.url))) as client:
            token = (settings.data_dir / "owner.token").read_text().strip()
            client.headers["Authorization"] = f"Bearer {token}"
            yield client
    finally:
        hub.close()


def audit_rows(api: TestClient) -> list[dict[str, Any]]:
    answer = api.get("/v1/audit", params={"limit": 100})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def test_webhooks_added_and_removed_are_audited(api: TestClient) -> None:
    made = api.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["response.completed"]}
    )
    assert made.status_code == 201, made.text
    hook = made.json()["id"]
    assert api.delete(f"/v1/webhooks/{hook}").status_code == 200
    rows = [r for r in audit_rows(api) if r["target"] == hook]
    assert [r["action"] for r in rows] == ["webhook.added", "webhook.removed"]
    assert rows[0]["change"]["url"] == "http://127.0.0.1:9/hook"
    assert "secret" not in rows[0]["change"]


def test_a_pull_is_audited_once(api: TestClient) -> None:
    body = {"from": f"hf.co/{REPO}:Q4_K_M", "id": "pulled-one"}
    assert api.post("/v1/models/pull", json=body).status_code == 202
    again = api.post("/v1/models/pull", json=body)  # the same pull, or its model: no row
    assert again.status_code in (202, 409), again.text
    rows = [r for r in audit_rows(api) if r["action"] == "model.pulled"]
    assert [(r["target"], r["change"]) for r in rows] == [
        ("pulled-one", {"from": f"hf.co/{REPO}:Q4_K_M"})
    ]
