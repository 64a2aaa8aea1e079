from __future__ import annotations

from fastapi.testclient import TestClient


def test_background_response_completes(client: TestClient) -> None:
    created = client.post(
        "/v1/responses", json={"model": "lmsp-test", "input": "hi", "background": True}
    )
    assert created.status_code == 202
    assert created.headers["location"] == f"/v1/responses/{created.json()['id']}"
    with client.stream(
        "GET", f"/v1/responses/{created.json()['id']}", params={"stream": "true"}
    ) as stream:
        body = stream.read().decode()
    assert "event: response.completed" in body
    final = client.get(f"/v1/responses/{created.json()['id']}").json()
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"]
