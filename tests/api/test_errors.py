"""Bad input gets the right status and error shape (PROTOCOL.md 8), and writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.config import Settings

GOOD = {"model": "lmsp-test", "input": "hi"}


def snapshot(client: TestClient) -> tuple[int, ...]:
    conn = client.app.state.lmsp.db.reader()  # type: ignore[attr-defined]
    return tuple(
        conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("responses", "tasks", "task_events", "idempotency_keys", "clients")
    )


def assert_error(response: Any, status: int, err_type: str, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["type"] == err_type
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    assert "Traceback" not in response.text
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "lmsp-test"}, "input"),
        ({"model": 5, "input": "hi"}, "model"),
        ({"model": "lmsp-test", "input": 5}, "input"),
        ({"model": "lmsp-test", "input": ""}, "input"),
        ({"model": "lmsp-test", "input": []}, "input"),
        ({"model": "lmsp-test", "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "temperature": 3}, "temperature"),
        ({**GOOD, "top_p": 0}, "top_p"),
        ({**GOOD, "max_output_tokens": "5"}, "max_output_tokens"),
        ({**GOOD, "max_output_tokens": 0}, "max_output_tokens"),
        ({**GOOD, "stream": "yes"}, "stream"),
        ({**GOOD, "background": 1}, "background"),
        ({**GOOD, "seed": -1}, "seed"),
        ({**GOOD, "seed": 1.5}, "seed"),
        ({**GOOD, "on_restart": "sometimes"}, "on_restart"),
        ({**GOOD, "metadata": {"k": 1}}, "metadata.k"),
        ({**GOOD, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({**GOOD, "background": True, "store": False}, "store"),
    ],
)
def test_invalid_bodies_get_400_with_param(
    client: TestClient, body: dict[str, Any], param: str
) -> None:
    before = snapshot(client)
    error = assert_error(client.post("/v1/responses", json=body), 400, "invalid_request_error")
    assert error["param"] == param
    assert snapshot(client) == before


def test_unknown_model_says_so(client: TestClient) -> None:
    error = assert_error(
        client.post("/v1/responses", json={"model": "gpt-9", "input": "hi"}),
        404,
        "not_found_error",
        "model_not_found",
    )
    assert "gpt-9" in error["message"]


@pytest.mark.parametrize("raw", [b"{", b"not json", b'{"model": "lmsp-test", "input": "hi",}'])
def test_malformed_json(client: TestClient, raw: bytes) -> None:
    before = snapshot(client)
    assert_error(
        client.post("/v1/responses", content=raw, headers={"content-type": "application/json"}),
        400,
        "invalid_request_error",
        "invalid_json",
    )
    assert snapshot(client) == before


def test_body_that_is_not_an_object(client: TestClient) -> None:
    before = snapshot(client)
    assert_error(client.post("/v1/responses", json=[1, 2]), 400, "invalid_request_error")
    assert_error(client.post("/v1/responses", content=b""), 400, "invalid_request_error")
    assert snapshot(client) == before


def test_oversized_body_gets_413(settings: Settings) -> None:
    small = settings.with_overrides(max_body_bytes=1000)
    with TestClient(create_app(small)) as client:
        token = (small.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        before = snapshot(client)
        big = {"model": "lmsp-test", "input": "x" * 5000}
        assert_error(
            client.post("/v1/responses", json=big),
            413,
            "invalid_request_error",
            "request_too_large",
        )

        def chunks():  # no Content-Length: the limit still holds while streaming
            for _ in range(10):
                yield b"x" * 500

        assert_error(client.post("/v1/responses", content=chunks()), 413, "invalid_request_error")
        assert snapshot(client) == before


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer lmsp_wrong"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer "},
    ],
)
def test_missing_or_invalid_token_gets_401(client: TestClient, headers: dict[str, str]) -> None:
    client.headers.pop("Authorization")
    before = snapshot(client)
    for method, path in [
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/resp_x"),
        ("POST", "/v1/responses/resp_x/cancel"),
        ("DELETE", "/v1/responses/resp_x"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/lmsp-test"),
        ("GET", "/v1/tasks"),
        ("GET", "/v1/tasks/task_x"),
        ("GET", "/v1/tasks/task_x/events"),
        ("POST", "/v1/tasks/task_x/cancel"),
    ]:
        response = client.request(method, path, json=GOOD, headers=headers)
        assert_error(response, 401, "authentication_error")
        assert response.headers["www-authenticate"] == "Bearer"
    assert snapshot(client) == before


def test_open_endpoints_need_no_token(client: TestClient) -> None:
    client.headers.pop("Authorization")
    assert client.get("/healthz").json() == {"status": "ok", "engines": []}
    service = client.get("/v1/service").json()
    assert service["object"] == "service" and service["protocol"] == "lmsp/1.0"
    assert service["id"].startswith("svc_")


def test_unknown_ids_and_routes_get_404(client: TestClient) -> None:
    assert_error(client.get("/v1/responses/resp_nope"), 404, "not_found_error")
    assert_error(client.get("/v1/tasks/task_nope"), 404, "not_found_error")
    assert_error(client.get("/v1/models/nope"), 404, "not_found_error")
    assert_error(client.get("/v1/nothing-here"), 404, "not_found_error")


def test_wrong_method_gets_405(client: TestClient) -> None:
    assert_error(client.put("/v1/responses"), 405, "invalid_request_error")


def test_bad_query_parameters_get_400(client: TestClient) -> None:
    created = client.post("/v1/responses", json=GOOD).json()
    error = assert_error(
        client.get(f"/v1/responses/{created['id']}", params={"starting_after": "x"}),
        400,
        "invalid_request_error",
    )
    assert error["param"] == "starting_after"
    error = assert_error(
        client.get("/v1/tasks", params={"limit": 1000}), 400, "invalid_request_error"
    )
    assert error["param"] == "limit"
    assert_error(client.get("/v1/tasks", params={"status": "bogus"}), 400, "invalid_request_error")


def test_full_queue_gets_429_with_retry_after(settings: Settings) -> None:
    tiny = settings.with_overrides(max_queue=2, parallel=1)
    with TestClient(create_app(tiny)) as client:
        token = (tiny.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        svc = client.app.state.lmsp  # type: ignore[attr-defined]
        svc.runner.pause()  # nothing leaves the queue
        body = {**GOOD, "background": True}
        assert client.post("/v1/responses", json=body).status_code == 202
        assert client.post("/v1/responses", json=body).status_code == 202
        before = snapshot(client)
        response = client.post("/v1/responses", json=body)
        assert_error(response, 429, "rate_limit_error", "queue_full")
        assert int(response.headers["retry-after"]) > 0
        assert snapshot(client) == before


def test_openapi_document_is_served(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/responses", "/v1/responses/{response_id}", "/v1/tasks/{task_id}/events"):
        assert path in doc["paths"]


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "f", "schema": {}}}},
            "text.format.schema",
        ),
        (
            "/v1/responses",
            {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {}}]},
            "tools",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "f", "schema": {}},
                },
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_model_that_cannot_constrain_refuses_tools_and_schemas(
    client: TestClient, path: str, extra: dict[str, Any], param: str
) -> None:
    """The test engine holds no output to a grammar: a request that needs one is a 400
    naming the field, written nowhere (not a task that fails, nor a 500)."""
    before = snapshot(client)
    answer = client.post(path, json={"model": "lmsp-test", **extra})
    error = assert_error(answer, 400, "invalid_request_error", "unsupported_parameter")
    assert error["param"] == param
    assert snapshot(client) == before
