"""Embeddings through the official ``openai`` SDK, unchanged, against a real ``lmsp
serve`` running the real model (llama.cpp's embedding mode in the engine process): the
same input gives the same vector, different texts differ, base64 (the SDK's default)
decodes to the floats, a batch gives what one by one gives, usage counts the model's
tokens; refusals are section-8 ``400``s that write nothing; a reranker is refused as a
model that cannot embed; and generation beside embeddings is what it is alone."""

from __future__ import annotations

import base64
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from lmsp.bootstrap import bundled_model_path
from tests.gguf_files import with_pooling
from tests.helpers import Server, llama_tokens, open_db, served

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
TEXTS = [
    "The cat sat on the mat.",
    "Durable tasks survive a crash of the service.",
    "Embeddings map texts to vectors.",
    "The cat sat on the mat.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_EMBED_MAX_INPUTS": "16", "LMSP_EMBED_MAX_TOKENS": "64"}
    with served(tmp_path_factory.mktemp("embeddings-sdk") / "data", env) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=server.token, max_retries=0, timeout=600
    ) as client:
        yield client


def rows(made: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The vectors of an answer; base64 asked for explicitly reaches the caller as text
    (the SDK decodes it only when it chose the encoding itself): decoded here."""
    assert [d.index for d in made.data] == list(range(len(made.data)))
    return np.array(
        [
            np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
            if isinstance(d.embedding, str)
            else d.embedding
            for d in made.data
        ],
        dtype=np.float32,
    )


def token_count(text: str) -> int:
    """The text's tokens by llama.cpp itself, as an embedding reads it."""
    return llama_tokens(text, special=True)


def test_same_in_same_out_and_different_texts_differ(sdk: openai.OpenAI) -> None:
    made = sdk.embeddings.create(model=MODEL, input=TEXTS)  # base64 on the wire: the default
    assert made.object == "list" and made.model == MODEL
    vectors = rows(made)
    assert vectors.shape == (4, 576)  # SmolLM2-135M's width
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # L2-normalised
    assert np.array_equal(vectors[0], vectors[3])
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.allclose(vectors[i], vectors[j], atol=1e-3)
    again = rows(sdk.embeddings.create(model=MODEL, input=TEXTS[1]))
    assert np.array_equal(again[0], vectors[1])
    total = sum(token_count(t) for t in TEXTS)
    assert made.usage.prompt_tokens == total and made.usage.total_tokens == total


def test_base64_decodes_to_the_floats(sdk: openai.OpenAI) -> None:
    floats = sdk.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    packed = sdk.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="base64")
    assert all(isinstance(d.embedding, str) for d in packed.data)
    assert np.array_equal(rows(floats), rows(packed))


def test_a_batch_gives_what_one_by_one_gives(sdk: openai.OpenAI) -> None:
    texts = [f"Passage {i}: {TEXTS[i % 3]}" for i in range(12)]
    batch = rows(sdk.embeddings.create(model=MODEL, input=texts))
    alone = np.concatenate([rows(sdk.embeddings.create(model=MODEL, input=t)) for t in texts])
    # several inputs share one llama.cpp batch as sequences of their own; each attends to
    # itself only, so the vectors agree (to float rounding, should a kernel split differ)
    assert np.allclose(batch, alone, atol=1e-5)


def test_token_arrays_and_dimensions(sdk: openai.OpenAI) -> None:
    from llama_cpp import Llama

    llm: Any = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    try:
        tokens = list(llm.tokenize(TEXTS[2].encode(), add_bos=True, special=True))
    finally:
        llm.close()
    by_tokens = rows(sdk.embeddings.create(model=MODEL, input=[tokens], dimensions=576))
    by_text = rows(sdk.embeddings.create(model=MODEL, input=TEXTS[2], user="tester"))
    assert np.array_equal(by_tokens, by_text)


def table_counts(data_dir: Path) -> dict[str, int]:
    conn: sqlite3.Connection = open_db(data_dir)
    try:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("responses", "tasks", "task_events", "idempotency_keys")
        }
    finally:
        conn.close()


REFUSED: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("dimensions", {"input": "x", "dimensions": 256}, "unsupported_parameter", "dimensions"),
    ("too many", {"input": ["x"] * 17}, "invalid_value", "input"),
    ("too long", {"input": ["short", "word " * 80]}, "context_length_exceeded", "input.1"),
    ("empty", {"input": ""}, "invalid_value", "input"),
    ("empty list", {"input": []}, "invalid_value", "input"),
    ("bad type", {"input": [{"text": "x"}]}, "invalid_value", "input"),
    ("outside the vocabulary", {"input": [[1, 10**7]]}, "invalid_value", "input.0.1"),
]


@pytest.mark.parametrize(
    ("body", "code", "param"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refusals_through_the_sdk(
    sdk: openai.OpenAI, server: Server, body: dict[str, Any], code: str, param: str | None
) -> None:
    before = table_counts(server.data_dir)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model=MODEL, **body)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict)
    assert set(error) == {"type", "code", "message", "param"}
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert error["param"] == param and error["message"]
    assert table_counts(server.data_dir) == before


def test_a_reranker_cannot_embed(sdk: openai.OpenAI, server: Server, tmp_path: Path) -> None:
    source = with_pooling(tmp_path / "reranker.gguf", 4)  # llama.pooling_type = rank
    with server.client() as http:
        made = http.post("/v1/models", json={"id": "smol-rank", "path": str(source)})
        assert made.status_code == 201, made.text
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.embeddings.create(model="smol-rank", input="x")
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "model_cannot_embed" and error["param"] == "model"
        assert "rerank" in error["message"]
    finally:
        with server.client() as http:
            http.delete("/v1/models/smol-rank")


def test_generation_is_not_disturbed_by_embeddings(sdk: openai.OpenAI) -> None:
    """Greedy chat completions are the same, bit for bit, alone and while embeddings
    are computed in the same engine (their own context, between its steps)."""

    def complete() -> str:
        made = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name three colours."}],
            temperature=0,
            max_tokens=40,
        )
        return made.choices[0].message.content or ""

    alone = complete()
    stop = threading.Event()
    embedded: list[int] = []

    def embed_meanwhile() -> None:
        while not stop.is_set():
            made = sdk.embeddings.create(model=MODEL, input=[f"{t} {len(embedded)}" for t in TEXTS])
            embedded.append(len(made.data))

    worker = threading.Thread(target=embed_meanwhile)
    worker.start()
    try:
        beside = [complete() for _ in range(2)]
    finally:
        stop.set()
        worker.join(120)
    assert embedded, "no embedding ran beside the generation"
    assert beside == [alone, alone]
