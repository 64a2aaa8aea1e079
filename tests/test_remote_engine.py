"""A remote model (docs/remote-engines.md) through the real server against a real
upstream: llama.cpp's ``llama-server`` on loopback with the bundled GGUF
(:mod:`tests.upstream`; skipped without the binary unless
``LMSP_REQUIRE_LLAMA_SERVER=1``).

Added with its tokenizer checked against the upstream's and its capabilities probed and
stored; a background response on it completes, streams, resumes its stream from a
sequence number, and its text is the upstream's own greedy answer to the same token ids.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench import llama_server

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.base import Sampling
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.engines.upstream import RemoteSpec, completion_body
from tests import remote_fixtures
from tests.helpers import Server, early_starts, finish, idle, open_db
from tests.remote_fixtures import (
    MODEL,
    add,
    add_body,
    decoded,
    output_text,
    prompt_tokens,
    sse,
)
from tests.upstream import Upstream

# the fixtures every remote-engine test takes
lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream

pytestmark = pytest.mark.slow

PROMPT = "Write three sentences about lighthouses and the sea."


def vocab_file(name: str) -> Path:
    """A vocabulary-only GGUF that llama.cpp's sources ship (in the sdist the upstream
    was built from)."""
    root = llama_server.binary_path(llama_server.installed_version()).parents[2]
    path = root / "vendor" / "llama.cpp" / "models" / f"ggml-vocab-{name}.gguf"
    assert path.exists(), path
    return path


def test_a_remote_model_is_added_with_its_capabilities_and_shown(
    lmsp: Server, upstream: Upstream
) -> None:
    """``lmsp models add --remote`` checks the tokenizer against the upstream's and
    stores what the upstream can do; ``lmsp models show`` prints it."""
    common = ["--url", lmsp.url, "--token", lmsp.token]
    env = dict(os.environ, COLUMNS="200")
    remote = ["--remote", upstream.url, "--upstream-model", "smollm2", "--inflight", "2"]
    tokenizer = ["--tokenizer", str(bundled_model_path())]
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmsp",
            "models",
            "add",
            "--id",
            MODEL,
            *remote,
            *tokenizer,
            *common,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert added.returncode == 0, added.stderr
    assert f"added {MODEL}" in added.stdout and "llama-server" in added.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "lmsp", "models", "show", MODEL, *common],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    for word in (
        upstream.url,
        "capability grammar",
        "capability gbnf",
        "capability token_ids",
        "2048",
    ):
        assert word in shown.stdout, shown.stdout
    with lmsp.client() as http:
        model = http.get(f"/v1/models/{MODEL}").json()
    caps = model["remote"]["capabilities"]
    assert caps["dialect"] == "llama-server" and caps["n_ctx"] == 2048 and caps["slots"] == 2
    assert caps["token_ids"] and caps["streamed_ids"] and caps["logprobs"]
    assert caps["grammar"] is False  # this build of llama-server has no llguidance
    assert caps["gbnf"] is True  # but holds output to a GBNF grammar (JSON schemas)
    assert caps["embeddings"] is False  # started without --embeddings
    assert model["context_length"] == 2048


def test_a_background_response_on_a_remote_model_is_the_upstreams_greedy_answer(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        add(http, upstream)
        body = {
            "model": MODEL,
            "input": PROMPT,
            "background": True,
            "temperature": 0,
            "max_output_tokens": 48,
        }
        created = http.post("/v1/responses", json=body)
        assert created.status_code == 202, created.text
        rid = created.json()["id"]
        whole = {"stream": "true", "include": "lmsp.lifecycle"}  # every event: no gaps
        with http.stream("GET", f"/v1/responses/{rid}", params=whole) as stream:
            events = list(sse(stream))
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        numbers = [e["sequence_number"] for e in events]
        assert numbers == list(range(len(numbers)))
        middle = numbers[len(numbers) // 2]
        params = {**whole, "starting_after": str(middle)}
        with http.stream("GET", f"/v1/responses/{rid}", params=params) as stream:
            rest = list(sse(stream))
        assert rest == [e for e in events if e["sequence_number"] > middle]
        final = http.get(f"/v1/responses/{rid}").json()
        # the engine up, a worker waiting: the next one's upstream request is sent while
        # its create commits (runner/early.py), and that is the stream its task reads
        idle(http)
        again = finish(http, http.post("/v1/responses", json=body).json()["id"])
        assert early_starts(http) == {"adopted": 1}
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    prompt = prompt_tokens(PROMPT)
    assert final["usage"]["input_tokens"] == len(prompt)
    expected = decoded(upstream.greedy(prompt, 48))
    assert len(expected) > 40
    assert output_text(final) == streamed == expected == output_text(again)
    conn = open_db(lmsp.data_dir)
    try:
        engine = conn.execute("SELECT engine, remote FROM models WHERE id = ?", (MODEL,)).fetchone()
    finally:
        conn.close()
    assert engine[0] == "remote" and json.loads(engine[1])["url"] == upstream.url


def test_a_greedy_draw_asks_llama_server_for_its_top_token_only() -> None:
    """Greedy without logprobs, llama-server is sent ``top_k`` 1 (the argmax, as at
    temperature 0, without its softening the whole vocabulary each token); a sampled
    draw, or one whose logprobs list the alternatives, keeps the request's ``top_k``.
    That the answer is still the upstream's own greedy one over the whole vocabulary
    (``top_k`` 0) is the test above, against the real llama-server."""
    spec = RemoteSpec("http://127.0.0.1:1", "m", capabilities={"dialect": "llama-server"})
    for sampling, sent in [
        (Sampling(temperature=0.0), 1),
        (Sampling(temperature=0.0, repeat_penalty=1.3, top_k=40), 1),
        (Sampling(temperature=0.0, logprobs=True, top_logprobs=3), 0),
        (Sampling(temperature=0.7, top_k=0), 0),
        (Sampling(temperature=0.7, top_k=40), 40),
    ]:
        _, body = completion_body(spec, [1, 2], sampling, 8)
        assert body["top_k"] == sent, sampling


def test_a_tokenizer_that_differs_from_the_upstreams_is_refused_and_nothing_written(
    lmsp: Server, upstream: Upstream
) -> None:
    """A GGUF of another model's vocabulary (GPT-2's, from the llama.cpp sources the
    upstream was built from) is refused with a clear error, and so is an upstream that
    cannot be reached: nothing is written."""
    other = vocab_file("gpt-2")
    with lmsp.client(timeout=300) as http:
        body = dict(add_body(upstream), path=str(other))
        refused = http.post("/v1/models", json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "tokenizer_mismatch" and error["param"] == "tokenizer"
        assert "does not match the upstream" in error["message"]
        assert http.get(f"/v1/models/{MODEL}").status_code == 404
        nowhere = dict(add_body(upstream)["remote"], url="http://127.0.0.1:9")
        gone = dict(add_body(upstream), remote=nowhere)
        unreachable = http.post("/v1/models", json=gone)
        assert unreachable.status_code == 400
        assert unreachable.json()["error"]["code"] == "upstream_unreachable"
    conn = open_db(lmsp.data_dir)
    try:
        assert conn.execute("SELECT count(*) FROM models WHERE id = ?", (MODEL,)).fetchone()[0] == 0
    finally:
        conn.close()


def test_embeddings_of_a_remote_model_are_the_upstreams_own(lmsp: Server, tmp_path: Path) -> None:
    """An upstream started with ``--embeddings`` is probed as able to embed; lmsp's
    ``POST /v1/embeddings`` on the remote model sends the inputs as token ids and gives
    back the upstream's vectors, L2-normalised."""
    upstream = Upstream(
        tmp_path / "llama-server-embed.log", extra=("--embeddings", "--pooling", "last")
    ).start()
    texts = ["The keeper lit the lamp.", "Gulls circled the harbour at dawn."]
    try:
        with lmsp.client(timeout=300) as http:
            added = add(http, upstream)
            assert added["remote"]["capabilities"]["embeddings"] is True
            answer = http.post("/v1/embeddings", json={"model": MODEL, "input": texts})
            assert answer.status_code == 200, answer.text
            vectors = [d["embedding"] for d in answer.json()["data"]]
        tokenizer = LlamaTokenizer(bundled_model_path(), 0)
        try:
            ids = [tokenizer.text_tokens(text) for text in texts]
        finally:
            tokenizer.close()
        for got, tokens in zip(vectors, ids, strict=True):
            own = upstream.embedding(tokens)
            norm = math.sqrt(sum(x * x for x in own))
            assert len(got) == len(own)
            assert max(abs(a - b / norm) for a, b in zip(got, own, strict=True)) < 1e-5
    finally:
        upstream.stop()


def test_logprobs_of_a_remote_model_come_from_the_upstream(
    lmsp: Server, upstream: Upstream
) -> None:
    """``top_logprobs`` on a remote model: each token's entry and its alternatives are
    the upstream's (``n_probs``), their text decoded here; greedy, the chosen token is
    the most likely one."""
    with lmsp.client(timeout=300) as http:
        add(http, upstream)
        body = {
            "model": MODEL,
            "input": PROMPT,
            "temperature": 0,
            "max_output_tokens": 16,
            "top_logprobs": 3,
        }
        done = http.post("/v1/responses", json=body).json()
    assert done["status"] in ("completed", "incomplete"), done
    part = done["output"][0]["content"][0]
    entries = part["logprobs"]
    assert len(entries) == done["usage"]["output_tokens"]
    assert "".join(e["token"] for e in entries) == part["text"]
    for entry in entries:
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] <= 0
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
