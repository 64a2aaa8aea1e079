"""What the remote-engine tests share (tests/test_remote_*.py): a real ``llama-server``
upstream (:mod:`tests.upstream`) and a real ``lmsp serve`` as fixtures, adding the
bundled model as a remote model, reading a response's stream and its task's events, the
bundled tokenizer's own tokens and text, and a ``tokenizer.json`` of the bundled model
built offline from its GGUF's vocabulary and merges.

A test module takes the fixtures by importing them (``from tests.remote_fixtures import
lmsp, upstream``)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_cpp import LlamaTokenizer
from tests.helpers import Server, open_db, seeded_data_dir, task_log
from tests.upstream import Upstream

MODEL = "remote-smol"
#: a prompt the bundled model answers at length (it counts on and on)
LONG = "Count from 1 to 300, one number per line."
TOKENS = 160


def serve(tmp_path: Path, blob_cache: Path, parallel: int = 2) -> Iterator[Server]:
    """A real ``lmsp serve`` on a seeded data directory, stopped after the test."""
    server = Server(
        seeded_data_dir(tmp_path / "data", blob_cache), env={"LMSP_PARALLEL": str(parallel)}
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def upstreams(tmp_path: Path, count: int) -> Iterator[list[Upstream]]:
    """``count`` real llama-servers on loopback, stopped after the test."""
    started: list[Upstream] = []
    try:
        for i in range(count):
            started.append(Upstream(tmp_path / f"llama-server-{i}.log").start())
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Upstream]:
    for started in upstreams(tmp_path, 1):
        yield started[0]


@pytest.fixture
def lmsp(tmp_path: Path, blob_cache: Path) -> Iterator[Server]:
    yield from serve(tmp_path, blob_cache)


def add_body(
    upstream: Upstream, model: str = MODEL, tokenizer: Path | None = None, **remote: Any
) -> dict[str, Any]:
    given = {"url": upstream.url, "upstream_model": "smollm2", "inflight": 2, **remote}
    path = tokenizer or bundled_model_path()
    return {"id": model, "path": str(path), "remote": given}


def add(http: httpx.Client, upstream: Upstream, **remote: Any) -> dict[str, Any]:
    added = http.post("/v1/models", json=add_body(upstream, **remote), timeout=300)
    assert added.status_code == 201, added.text
    body: dict[str, Any] = added.json()
    return body


def sse(stream: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in stream.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def prompt_tokens(text: str) -> list[int]:
    tokenizer = LlamaTokenizer(bundled_model_path(), 0)
    try:
        return tokenizer.prompt_tokens([{"role": "user", "content": text}])
    finally:
        tokenizer.close()


def decoded(tokens: list[int]) -> str:
    tokenizer = LlamaTokenizer(bundled_model_path(), 0)
    try:
        ids = [t for t in tokens if t not in tokenizer.stop_ids]
        return bytes(tokenizer.llm.detokenize(ids)).decode("utf-8", errors="replace")
    finally:
        tokenizer.close()


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def task_events(server: Server, rid: str) -> list[dict[str, Any]]:
    """The stored events of response ``rid``'s task, read from the server's database."""
    conn: sqlite3.Connection = open_db(server.data_dir)
    try:
        row = conn.execute("SELECT id FROM tasks WHERE response_id = ?", (rid,)).fetchone()
        return task_log(conn, row[0])
    finally:
        conn.close()


def smollm_tokenizer_json(out: Path, prefix_space: bool = False) -> Path:
    """The bundled model's ``tokenizer.json`` (and its ``tokenizer_config.json``), built
    offline with the ``tokenizers`` library from its GGUF's vocabulary, merges and token
    types (read with the ``gguf`` package), as Hugging Face ships SmolLM2's: byte-level
    BPE, each digit a token of its own. ``prefix_space=True`` puts a space before the
    text as some tokenizers do: one that differs from the upstream's."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(bundled_model_path())

    def field(name: str) -> Any:
        return reader.fields[name].contents()

    tokens: list[str] = field("tokenizer.ggml.tokens")
    kinds: list[int] = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, kinds, strict=True) if kind == 3]  # CONTROL
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "chat_template": field("tokenizer.chat_template"),
        "bos_token": tokens[int(field("tokenizer.ggml.bos_token_id"))],
        "eos_token": tokens[int(field("tokenizer.ggml.eos_token_id"))],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out / "tokenizer.json"


def start(http: httpx.Client, policy: str, tokens: int = TOKENS) -> str:
    body = {
        "model": MODEL,
        "input": LONG,
        "background": True,
        "temperature": 0,
        "max_output_tokens": tokens,
        "on_restart": policy,
    }
    created = http.post("/v1/responses", json=body)
    assert created.status_code == 202, created.text
    rid: str = created.json()["id"]
    return rid


def after_deltas(http: httpx.Client, rid: str, count: int) -> list[dict[str, Any]]:
    """The response's events until ``count`` text deltas have been committed."""
    seen: list[dict[str, Any]] = []
    with http.stream("GET", f"/v1/responses/{rid}", params={"stream": "true"}) as stream:
        for event in sse(stream):
            seen.append(event)
            if sum(e["type"] == "response.output_text.delta" for e in seen) >= count:
                break
    return seen


def final(http: httpx.Client, rid: str, deadline: float = 300) -> dict[str, Any]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        response: dict[str, Any] = http.get(f"/v1/responses/{rid}").json()
        if response["status"] not in ("queued", "in_progress"):
            return response
        time.sleep(0.2)
    raise AssertionError(f"{rid} did not finish")


def greedy_text(upstream: Upstream, tokens: int = TOKENS) -> str:
    return decoded(upstream.greedy(prompt_tokens(LONG), tokens))


def under_way(
    http: httpx.Client, upstream: Upstream, policy: str, tokens: int = TOKENS, **remote: Any
) -> str:
    """The bundled model added as a remote model on ``upstream``, a background task of
    :data:`LONG` under ``policy`` started on it and followed until 5 text deltas are
    committed: the response's id."""
    add(http, upstream, **remote)
    rid = start(http, policy, tokens)
    after_deltas(http, rid, 5)
    return rid


def refused_add(http: httpx.Client, name: str, answer: httpx.Response, model: str) -> list[str]:
    """What is wrong with a hostile ``POST /v1/models`` of ``model`` (``name``: its kind):
    it must be a 400 with a code and a message, and write no model."""
    wrong: list[str] = []
    error = answer.json().get("error") if answer.status_code >= 400 else None
    if answer.status_code != 400 or not isinstance(error, dict):
        wrong.append(f"add {name}: {answer.status_code} {answer.text[:200]}")
    elif not (error.get("code") and error.get("message")):
        wrong.append(f"add {name}: an error without code or message: {error}")
    if http.get(f"/v1/models/{model}").status_code != 404:
        wrong.append(f"add {name}: the model was written")
        http.delete(f"/v1/models/{model}")
    return wrong
