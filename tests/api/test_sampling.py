"""Sampling parameters and per-model defaults through the in-process app (test engine):
every number accepted, stored and echoed; log probabilities on text deltas; defaults set
on import and by ``PATCH /v1/models/{id}``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.bootstrap import bundled_model_path
from tests.api.test_wire import counts, stream
from tests.openresponses import check_object

BODY: dict[str, Any] = {"model": "lmsp-test", "input": "hello", "seed": 3}
EVERY = {
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repeat_penalty": 1.1,
    "top_logprobs": 2,
}


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/responses", json={**BODY, **body})
    assert answer.status_code == 200, answer.text
    obj: dict[str, Any] = answer.json()
    check_object(obj)
    return obj


def stored_request(client: TestClient, response_id: str) -> dict[str, Any]:
    conn = client.app.state.lmsp.db.reader()  # type: ignore[attr-defined]
    row = conn.execute("SELECT request FROM responses WHERE id = ?", (response_id,)).fetchone()
    return dict(json.loads(row[0]))


def test_every_parameter_is_accepted_stored_and_echoed(client: TestClient) -> None:
    obj = create(client, **EVERY)
    for name, value in EVERY.items():
        assert obj[name] == value, name
    stored = stored_request(client, obj["id"])
    assert {name: stored[name] for name in EVERY} == EVERY


def test_lmsp_defaults_are_echoed(client: TestClient) -> None:
    obj = create(client)
    assert (obj["temperature"], obj["top_p"], obj["top_logprobs"]) == (1.0, 1.0, 0)
    assert (obj["presence_penalty"], obj["frequency_penalty"]) == (0.0, 0.0)
    assert (obj["top_k"], obj["min_p"], obj["repeat_penalty"]) == (0, 0.0, 1.0)


def test_logprobs_on_deltas_and_in_the_final_part(client: TestClient) -> None:
    events = stream(
        client,
        "POST",
        "/v1/responses",
        json={**BODY, "stream": True, "top_logprobs": 3},
    )
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas
    for delta in deltas:  # the tokens a delta joins (logged together): one entry each
        assert delta["logprobs"]
        assert "".join(e["token"] for e in delta["logprobs"]) == delta["delta"]
        for entry in delta["logprobs"]:
            assert bytes(entry["bytes"]).decode() == entry["token"]
            assert len(entry["top_logprobs"]) == 3
            assert entry["logprob"] < 0
    final = events[-1]["response"]
    part = final["output"][0]["content"][0]
    assert len(part["logprobs"]) == sum(len(d["logprobs"]) for d in deltas)
    assert len(part["logprobs"]) == final["usage"]["output_tokens"]  # a word a token here
    # include asks for them without alternatives
    obj = create(client, include=["message.output_text.logprobs"])
    entries = obj["output"][0]["content"][0]["logprobs"]
    assert entries and all(e["top_logprobs"] == [] for e in entries)
    # not asked: none
    assert create(client)["output"][0]["content"][0]["logprobs"] == []


def test_model_defaults_apply_to_requests_that_do_not_name_a_value(client: TestClient) -> None:
    changed = client.patch(
        "/v1/models/lmsp-test", json={"defaults": {"temperature": 0.3, "top_k": 7}}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["defaults"] == {"temperature": 0.3, "top_k": 7}
    assert client.get("/v1/models/lmsp-test").json()["defaults"] == changed.json()["defaults"]
    obj = create(client)
    assert (obj["temperature"], obj["top_k"], obj["top_p"]) == (0.3, 7, 1.0)
    own = create(client, temperature=0.9, top_k=0)
    assert (own["temperature"], own["top_k"]) == (0.9, 0)
    # defaults merge; null removes one
    client.patch("/v1/models/lmsp-test", json={"defaults": {"top_k": None, "min_p": 0.1}})
    assert client.get("/v1/models/lmsp-test").json()["defaults"] == {
        "temperature": 0.3,
        "min_p": 0.1,
    }
    later = create(client)
    assert (later["temperature"], later["top_k"], later["min_p"]) == (0.3, 0, 0.1)
    # a response created before keeps the numbers it was created with
    assert client.get(f"/v1/responses/{obj['id']}").json()["top_k"] == 7


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"defaults": {"temperature": 3}}, 400, "defaults.temperature"),
        ({"defaults": {"top_k": -1}}, 400, "defaults.top_k"),
        ({"defaults": {"repeat_penalty": 0}}, 400, "defaults.repeat_penalty"),
        ({"defaults": {"top_logprobs": 2}}, 400, "defaults.top_logprobs"),
        ({"defaults": {"temprature": 0.5}}, 400, "defaults.temprature"),
        ({}, 400, "defaults"),
    ],
)
def test_bad_defaults_are_named(
    client: TestClient, body: dict[str, Any], status: int, param: str
) -> None:
    answer = client.patch("/v1/models/lmsp-test", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
    assert client.get("/v1/models/lmsp-test").json()["defaults"] == {}


def test_defaults_of_an_unknown_model(client: TestClient) -> None:
    answer = client.patch("/v1/models/nope", json={"defaults": {"temperature": 0.5}})
    assert answer.status_code == 404


def test_defaults_given_on_import(client: TestClient) -> None:
    answer = client.post(
        "/v1/models",
        json={
            "id": "imported",
            "path": str(bundled_model_path()),
            "defaults": {"temperature": 0.4, "repeat_penalty": 1.2},
        },
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["defaults"] == {"temperature": 0.4, "repeat_penalty": 1.2}


def test_the_bundled_model_has_defaults(client: TestClient) -> None:
    defaults = client.get("/v1/models/smollm2-135m-instruct").json()["defaults"]
    assert defaults["temperature"] < 1.0 and defaults["repeat_penalty"] > 1.0


def test_chat_refuses_logprobs_and_honours_penalties(client: TestClient) -> None:
    before = counts(client)
    chat = {"model": "lmsp-test", "messages": [{"role": "user", "content": "hi"}]}
    for extra, param in (({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs")):
        answer = client.post("/v1/chat/completions", json={**chat, **extra})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param
    assert counts(client) == before
    answer = client.post(
        "/v1/chat/completions",
        json={**chat, "presence_penalty": 0.5, "frequency_penalty": 0.25},
    )
    assert answer.status_code == 200, answer.text
    response = client.get(f"/v1/responses/{answer.json()['id']}").json()
    assert (response["presence_penalty"], response["frequency_penalty"]) == (0.5, 0.25)
