"""Bad input answers 4xx in the section-8 shape and writes nothing (issue 8, defect 5),
and an Idempotency-Key never makes a second response (defect 6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.config import Settings
from tests.helpers import open_db

BODY = {"model": "lmsp-test", "input": "hello"}
HALF = "\ud83d"  # the first half of a surrogate pair, alone


def counts(settings: Settings) -> tuple[int, ...]:
    conn = open_db(settings.data_dir)
    try:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("responses", "tasks", "task_events", "idempotency_keys", "clients")
        )
    finally:
        conn.close()


def raw_post(client: TestClient, path: str, body: Any, **headers: str) -> Any:
    """``json.dumps`` writes a lone surrogate as the escape ``\\ud800``, as a client would."""
    return client.post(
        path, content=json.dumps(body), headers={"content-type": "application/json", **headers}
    )


def refused(answer: Any, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**BODY, "instructions": "be \ud800 brief"}, "instructions"),
        ({**BODY, "input": "lone \udfff low"}, "input"),
        (
            {
                **BODY,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "\ud83d"}]}],
            },
            "input.0.content.0.text",
        ),
        ({**BODY, "metadata": {"k\ud800": "v"}}, "metadata.k\\ud800"),
        ({**BODY, "background": True, "metadata": {"k": "\udc00"}}, "metadata.k"),
    ],
)
def test_a_lone_surrogate_is_refused_before_anything_is_written(
    client: TestClient, settings: Settings, body: dict[str, Any], param: str
) -> None:
    before = counts(settings)
    error = refused(raw_post(client, "/v1/responses", body))
    assert error["code"] == "invalid_unicode"
    assert error["param"] == param
    assert counts(settings) == before
    # a surrogate pair is one character, not a lone surrogate: accepted
    ok = client.post("/v1/responses", json={**BODY, "instructions": "smile \U0001f642"})
    assert ok.status_code == 200, ok.text


def test_lone_surrogates_are_refused_on_every_post(client: TestClient, settings: Settings) -> None:
    before = counts(settings)
    for path, body in (
        ("/v1/pairing", {"client_name": "agent \ud800"}),
        ("/v1/clients", {"name": "x\udfff", "scopes": ["models:read"]}),
        ("/v1/models", {"id": "m", "path": "/tmp/\ud800.gguf"}),
    ):
        assert refused(raw_post(client, path, body))["code"] == "invalid_unicode", path
    assert counts(settings) == before


def test_a_body_nested_too_deeply_is_refused(client: TestClient) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    answer = client.post(
        "/v1/responses", content=deep, headers={"content-type": "application/json"}
    )
    assert refused(answer)["code"] == "invalid_json"


def finished(client: TestClient) -> dict[str, Any]:
    created = client.post("/v1/responses", json=BODY)
    assert created.status_code == 200
    obj: dict[str, Any] = created.json()
    return obj


@pytest.mark.parametrize("value", ["--5", "²", "1" * 20, "9223372036854775808", "1e3", "abc"])
def test_a_bad_last_event_id_is_a_400(client: TestClient, value: str) -> None:
    obj = finished(client)
    for url in (f"/v1/responses/{obj['id']}?stream=true", f"/v1/tasks/{obj['task']['id']}/events"):
        answer = client.get(url, headers={"Last-Event-ID": value.encode()})
        error = refused(answer)
        assert error["param"] == "Last-Event-ID", url


def test_a_good_last_event_id_resumes(client: TestClient) -> None:
    obj = finished(client)
    url = f"/v1/tasks/{obj['task']['id']}/events"
    page = client.get(url, headers={"Last-Event-ID": " 3 ", "Accept": "application/json"})
    assert page.json()["data"][0]["sequence_number"] == 4


@pytest.mark.parametrize("value", [str(2**63), str(2**64 + 5), "9" * 40])
def test_cursors_past_what_sqlite_holds_are_a_400(client: TestClient, value: str) -> None:
    obj = finished(client)
    for url, name in (
        (f"/v1/responses/{obj['id']}?stream=true&starting_after={value}", "starting_after"),
        (f"/v1/tasks/{obj['task']['id']}/events?after={value}", "after"),
    ):
        for accept in ("text/event-stream", "application/json"):
            answer = client.get(url, headers={"Accept": accept})
            assert refused(answer)["param"] == name, (url, accept)


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b'{"a": "\\ud800"}'])
def test_idempotency_key_with_a_bad_body_on_the_cancel_routes(
    client: TestClient, body: bytes
) -> None:
    obj = finished(client)
    for path in (f"/v1/responses/{obj['id']}/cancel", f"/v1/tasks/{obj['task']['id']}/cancel"):
        answer = client.post(
            path,
            content=body,
            headers={"Idempotency-Key": "cancel-1", "content-type": "application/json"},
        )
        assert 400 <= answer.status_code < 500, answer.text
        assert set(answer.json()["error"]) == {"type", "code", "message", "param"}


# -- idempotency keys hold for every POST ----------------------------------------------------


def test_a_key_on_a_store_false_request_never_makes_a_second_response(
    client: TestClient, settings: Settings
) -> None:
    body = {**BODY, "store": False}
    first = client.post("/v1/responses", json=body, headers={"Idempotency-Key": "nostore"})
    assert first.status_code == 200 and first.json()["status"] == "completed"
    before = counts(settings)
    again = client.post("/v1/responses", json=body, headers={"Idempotency-Key": "nostore"})
    error = refused(again, 422)
    assert error["code"] == "idempotency_key_spent" and error["param"] == "Idempotency-Key"
    assert counts(settings) == before


def test_a_key_after_its_response_was_deleted_never_makes_a_second_one(
    client: TestClient, settings: Settings
) -> None:
    first = client.post("/v1/responses", json=BODY, headers={"Idempotency-Key": "deleted"})
    assert client.delete(f"/v1/responses/{first.json()['id']}").status_code == 200
    before = counts(settings)
    again = client.post("/v1/responses", json=BODY, headers={"Idempotency-Key": "deleted"})
    assert refused(again, 422)["code"] == "idempotency_key_spent"
    assert counts(settings) == before


def test_a_post_that_cannot_honour_a_key_refuses_it(client: TestClient, settings: Settings) -> None:
    before = counts(settings)
    answer = client.post(
        "/v1/clients",
        json={"name": "twice?", "scopes": ["models:read"]},
        headers={"Idempotency-Key": "c1"},
    )
    error = refused(answer)
    assert error["code"] == "unsupported_parameter" and error["param"] == "Idempotency-Key"
    assert counts(settings) == before
