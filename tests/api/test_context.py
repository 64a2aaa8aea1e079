"""A prompt longer than the context: refused before ``202`` (and before anything is
written) with ``context_length_exceeded``, or, with ``truncation: "auto"``, run without
its oldest input items, the response saying which were dropped. The test engine's
context is :data:`lmsp.engines.deterministic.N_CTX` tokens (a prompt's bytes)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from lmsp.config import Settings
from lmsp.engines.deterministic import N_CTX
from tests.helpers import open_db

MODEL = "lmsp-test"


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def rows(settings: Settings) -> tuple[int, int]:
    conn = open_db(settings.data_dir)
    try:
        tasks = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
        responses = conn.execute("SELECT count(*) FROM responses").fetchone()[0]
        return int(tasks), int(responses)
    finally:
        conn.close()


def test_an_over_long_prompt_is_refused_before_anything_is_queued(
    client: TestClient, settings: Settings
) -> None:
    before = rows(settings)
    for background in (False, True):
        reply = client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "a" * (N_CTX + 10), "background": background},
        )
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "context_length_exceeded",
            "input",
        )
        assert "truncation" in error["message"]
    assert rows(settings) == before  # nothing written


def test_truncation_auto_drops_the_oldest_items_and_says_which(client: TestClient) -> None:
    third = N_CTX // 3
    items = [said("1" * third), said("2" * third), said("3" * third), said("question")]
    body = {"model": MODEL, "input": items, "max_output_tokens": 4}
    assert client.post("/v1/responses", json=body).status_code == 400
    done = client.post("/v1/responses", json={**body, "truncation": "auto"}).json()
    assert done["status"] == "incomplete", done  # ran, up to max_output_tokens
    assert done["truncation"] == "auto"
    dropped = done["truncated_input"]
    assert dropped["items"] == 1  # the fewest that make it fit
    listed = client.get(f"/v1/responses/{done['id']}/input_items", params={"order": "asc"})
    first = listed.json()["data"][0]  # every input item stays listed, as given
    brief = {"id": first["id"], "type": "message", "role": "user"}
    assert dropped == {"items": 1, "first": brief, "last": brief}
    assert done["usage"]["input_tokens"] < N_CTX
    again = client.get(f"/v1/responses/{done['id']}").json()
    assert again["truncated_input"] == dropped

    fits = client.post("/v1/responses", json={**body, "input": items[2:], "truncation": "auto"})
    assert fits.json()["truncated_input"] is None and fits.json()["truncation"] == "auto"


def test_truncation_auto_keeps_the_last_item_or_refuses(
    client: TestClient, settings: Settings
) -> None:
    before = rows(settings)
    items = [said("short"), said("x" * (N_CTX + 10))]
    reply = client.post(
        "/v1/responses", json={"model": MODEL, "input": items, "truncation": "auto"}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert rows(settings) == before


def test_truncation_auto_drops_a_previous_conversation_first(client: TestClient) -> None:
    half = N_CTX // 2
    first = client.post(
        "/v1/responses", json={"model": MODEL, "input": "p" * half, "max_output_tokens": 2}
    ).json()
    body = {
        "model": MODEL,
        "input": [said("q" * (half + 100))],
        "previous_response_id": first["id"],
        "max_output_tokens": 2,
    }
    assert client.post("/v1/responses", json=body).status_code == 400
    done = client.post("/v1/responses", json={**body, "truncation": "auto"}).json()
    assert done["status"] == "incomplete"
    assert done["truncated_input"]["items"] >= 1
    assert done["truncated_input"]["first"]["role"] == "user"  # the earlier turn's
