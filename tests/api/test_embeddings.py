"""``POST /v1/embeddings`` through the in-process app (deterministic test engine): the
answer's shapes, the vectors the engine computes, batching across the engine's turns,
and every refusal a ``400`` in section 8's shape that writes nothing."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from openai.types import CreateEmbeddingResponse

from lmsp.api.app import create_app
from lmsp.config import Settings
from lmsp.engines.deterministic import EMBED_BATCH, EMBED_DIM, embedding
from tests.api.test_wire import counts

URL = "/v1/embeddings"
MODEL = "lmsp-test"


def vectors(answer: dict[str, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    rows = []
    for i, item in enumerate(answer["data"]):
        assert item["object"] == "embedding" and item["index"] == i
        value = item["embedding"]
        if isinstance(value, str):
            rows.append(np.frombuffer(base64.b64decode(value), dtype="<f4"))
        else:
            rows.append(np.asarray(value, dtype=np.float32))
    return np.stack(rows)


def embed(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(URL, json={"model": MODEL, **body})
    assert answer.status_code == 200, answer.text
    made: dict[str, Any] = answer.json()
    if body.get("encoding_format") != "base64":  # the SDK's type holds decoded vectors
        CreateEmbeddingResponse.model_validate(made)
    return made


def test_the_answer_is_openais_shape_with_the_engines_vectors(client: TestClient) -> None:
    texts = ["retrieval", "augmented", "retrieval"]
    made = embed(client, {"input": texts})
    assert made["object"] == "list" and made["model"] == MODEL
    got = vectors(made)
    assert got.shape == (3, EMBED_DIM)
    # what the test engine computes for each input's tokens (its bytes), L2-normalised
    for row, text in zip(got, texts, strict=True):
        assert np.array_equal(row, embedding(list(text.encode())))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(got[0], got[2]) and not np.allclose(got[0], got[1])
    tokens = sum(len(t.encode()) for t in texts)
    assert made["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # one string is one input
    alone = embed(client, {"input": "augmented"})
    assert len(alone["data"]) == 1 and np.array_equal(vectors(alone)[0], got[1])


def test_base64_is_the_float32_bytes_of_the_floats(client: TestClient) -> None:
    floats = embed(client, {"input": "vector", "encoding_format": "float"})
    packed = embed(client, {"input": "vector", "encoding_format": "base64"})
    assert isinstance(packed["data"][0]["embedding"], str)
    assert np.array_equal(vectors(floats), vectors(packed))


def test_a_batch_over_several_engine_turns_equals_one_by_one(client: TestClient) -> None:
    texts = [f"passage number {i}" for i in range(3 * EMBED_BATCH + 1)]
    batch = vectors(embed(client, {"input": texts}))
    for i in (0, EMBED_BATCH - 1, EMBED_BATCH, len(texts) - 1):
        assert np.array_equal(batch[i], vectors(embed(client, {"input": texts[i]}))[0])


def test_token_arrays_are_the_texts_tokens(client: TestClient) -> None:
    text = "hi there"
    tokens = list(text.encode())  # the test engine's tokens are bytes
    by_text = vectors(embed(client, {"input": text}))
    one = embed(client, {"input": tokens})
    assert np.array_equal(vectors(one), by_text)
    assert one["usage"]["prompt_tokens"] == len(tokens)
    many = vectors(embed(client, {"input": [tokens, tokens[:2]]}))
    assert np.array_equal(many[0], by_text[0]) and not np.array_equal(many[0], many[1])


def test_dimensions_and_user_are_accepted_when_honoured(client: TestClient) -> None:
    made = embed(client, {"input": "x", "dimensions": EMBED_DIM, "user": "someone"})
    assert len(made["data"][0]["embedding"]) == EMBED_DIM


@pytest.fixture
def limited(settings: Settings) -> Iterator[TestClient]:
    small = dataclasses.replace(settings, embed_max_inputs=4, embed_max_tokens=16)
    with TestClient(create_app(small)) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


REFUSED: list[tuple[str, dict[str, Any], int, str, str | None]] = [
    ("dimensions", {"input": "x", "dimensions": 8}, 400, "unsupported_parameter", "dimensions"),
    ("too many inputs", {"input": ["a"] * 5}, 400, "invalid_value", "input"),
    ("too long", {"input": ["ok", "x" * 17]}, 400, "context_length_exceeded", "input.1"),
    ("too long alone", {"input": "x" * 17}, 400, "context_length_exceeded", "input"),
    ("empty string", {"input": ""}, 400, "invalid_value", "input"),
    ("an empty one", {"input": ["a", ""]}, 400, "invalid_value", "input.1"),
    ("empty list", {"input": []}, 400, "invalid_value", "input"),
    ("empty token array", {"input": [[1], []]}, 400, "invalid_value", "input.1"),
    ("a number", {"input": 3}, 400, "invalid_value", "input"),
    ("an object", {"input": {"text": "a"}}, 400, "invalid_value", "input"),
    ("mixed", {"input": ["a", 1]}, 400, "invalid_value", "input"),
    ("booleans", {"input": [True, False]}, 400, "invalid_value", "input.0"),
    ("negative token", {"input": [1, -2]}, 400, "invalid_value", "input.1"),
    ("outside the vocabulary", {"input": [1, 256]}, 400, "invalid_value", "input.1"),
    ("missing input", {}, 400, "invalid_value", "input"),
    ("encoding", {"input": "x", "encoding_format": "int8"}, 400, "invalid_value", None),
    ("unknown model", {"input": "x", "model": "nope"}, 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_refusals_are_section_8_errors_that_write_nothing(
    limited: TestClient, body: dict[str, Any], status: int, code: str, param: str | None
) -> None:
    before = counts(limited)
    answer = limited.post(URL, json={"model": MODEL, **body})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["code"] == code and error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if param is not None:
        assert error["param"] == param
    assert counts(limited) == before
    # the limits are what they say: at them, it works
    assert limited.post(URL, json={"model": MODEL, "input": ["x" * 16] * 4}).status_code == 200


def test_an_idempotency_key_is_refused_not_ignored(client: TestClient) -> None:
    answer = client.post(
        URL, json={"model": MODEL, "input": "x"}, headers={"Idempotency-Key": "embed-1"}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "Idempotency-Key"


def test_embeddings_are_counted_in_metrics(client: TestClient) -> None:
    embed(client, {"input": ["abc", "de"]})
    text = client.get("/metrics").text
    assert 'lmsp_embedding_inputs_total{model="lmsp-test"} 2.0' in text
    assert 'lmsp_embedding_tokens_total{model="lmsp-test"} 5.0' in text


def test_generation_goes_on_beside_embeddings(client: TestClient) -> None:
    """A background response and a large embedding request at once: both finish, and the
    response is what it is alone."""
    body = {"model": MODEL, "input": "tell me", "temperature": 0, "background": True}
    alone = client.post("/v1/responses", json=body).json()
    made = client.post("/v1/responses", json=body).json()
    batch = embed(client, {"input": [f"text {i}" for i in range(64)]})
    assert len(batch["data"]) == 64
    from tests.api.test_wire import wait_status

    first = wait_status(client, alone["id"], "completed")
    second = wait_status(client, made["id"], "completed")
    assert first["output"][0]["content"][0]["text"] == second["output"][0]["content"][0]["text"]
