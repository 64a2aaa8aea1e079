"""``POST /v1/completions`` (legacy) through the in-process app (deterministic test
engine): the prompt reaches the model as raw text, the completion is a stored response,
and what lmsp cannot honour is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types import Completion

from tests.api.test_wire import counts, log_of
from tests.helpers import check_log_invariants

BODY: dict[str, Any] = {"model": "lmsp-test", "prompt": "Once upon a time", "seed": 5}


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    text = "".join(line for line in raw.decode().splitlines(True) if line != ": ping\n")
    blocks = [b for b in text.split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]"
    return [json.loads(b.removeprefix("data: ")) for b in blocks[:-1]]


def test_a_completion_reads_the_prompt_raw(client: TestClient) -> None:
    answer = client.post("/v1/completions", json={**BODY, "max_tokens": 30})
    assert answer.status_code == 200, answer.text
    completion = answer.json()
    Completion.model_validate(completion)
    assert completion["object"] == "text_completion"
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "stop" and len(choice["text"].split()) == 24
    # the test engine reads a prompt byte by byte: no template around it
    assert completion["usage"]["prompt_tokens"] == len(BODY["prompt"].encode())
    assert completion["usage"]["completion_tokens"] == 24
    # durable: a response with its task and log, whose input is the prompt
    response = client.get(f"/v1/responses/{completion['id']}").json()
    assert response["status"] == "completed"
    items = client.get(f"/v1/responses/{completion['id']}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == BODY["prompt"]
    assert log_of(client, response["task"]["id"])[-1]["type"] == "response.completed"
    # a list of one prompt is the same prompt
    same = client.post(
        "/v1/completions", json={**BODY, "prompt": [BODY["prompt"]], "max_tokens": 30}
    )
    assert same.json()["choices"][0]["text"] == choice["text"]
    check_log_invariants(client.app.state.lmsp.db.reader())  # type: ignore[attr-defined]


def test_sixteen_tokens_unless_asked_and_a_stop(client: TestClient) -> None:
    short = client.post("/v1/completions", json=BODY).json()
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 16
    words = short["choices"][0]["text"].split(" ")
    # a word that first shows up after a few others
    at = next(i for i in range(2, 16) if words[i] not in " ".join(words[:i]))
    stopped = client.post("/v1/completions", json={**BODY, "stop": words[at]}).json()
    assert stopped["choices"][0]["text"] == " ".join(words[:at]) + " "
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_a_stream(client: TestClient) -> None:
    with client.stream(
        "POST",
        "/v1/completions",
        json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
    ) as answer:
        assert answer.status_code == 200
        chunks = chunks_of(answer.read())
    *deltas, last, usage = chunks
    for chunk in (last, usage):  # the deltas' finish_reason is null, as OpenAI streams it
        Completion.model_validate(chunk)
    for chunk in deltas:
        assert chunk.keys() == last.keys() and chunk["choices"][0]["finish_reason"] is None
    assert last["choices"][0]["finish_reason"] == "length" and usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 16
    whole = client.get(f"/v1/responses/{chunks[0]['id']}").json()
    text = "".join(c["choices"][0]["text"] for c in deltas)
    assert text == whole["output"][0]["content"][0]["text"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": [[1, 2]]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_lmsp_cannot_honour_is_refused(
    client: TestClient, extra: dict[str, Any], param: str
) -> None:
    before = counts(client)
    answer = client.post("/v1/completions", json={**BODY, **extra})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert counts(client) == before


def test_an_idempotency_key_replays_a_completion(client: TestClient) -> None:
    headers = {"Idempotency-Key": "completion-1"}
    first = client.post("/v1/completions", json=BODY, headers=headers).json()
    again = client.post("/v1/completions", json=BODY, headers=headers)
    assert again.headers["idempotent-replayed"] == "true" and again.json() == first
