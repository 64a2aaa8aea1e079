"""A remote model whose tokenizer is a ``tokenizer.json`` (docs/remote-engines.md), as for
a vLLM or SGLang upstream serving a Hugging Face model with no GGUF at hand — through the
real server against a real ``llama-server`` (:mod:`tests.upstream`).

The ``tokenizer.json`` is the bundled model's, built offline from its GGUF's vocabulary
and merges (:func:`tests.remote_fixtures.smollm_tokenizer_json`): it is checked against
the upstream's ``/tokenize`` when the model is added, counts a prompt's tokens as the
GGUF does, and decodes the upstream's greedy answer to the same text. One that tokenizes
otherwise is refused, and so is a reference to fetch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.hf_tokenizer import JsonTokenizer, read_config
from lmsp.engines.remote import RemoteTokenizer
from lmsp.engines.upstream import RemoteSpec
from tests import remote_fixtures
from tests.helpers import Server, open_db
from tests.remote_fixtures import (
    MODEL,
    add_body,
    decoded,
    output_text,
    prompt_tokens,
    smollm_tokenizer_json,
)
from tests.upstream import Upstream

pytestmark = pytest.mark.slow

# the fixtures every remote-engine test takes
lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream

PROMPT = "Name three colours, and say 12345 in words: café, 日本語, 🙂."


def models_in(server: Server) -> int:
    conn = open_db(server.data_dir)
    try:
        count: int = conn.execute("SELECT count(*) FROM models").fetchone()[0]
        return count
    finally:
        conn.close()


def test_a_tokenizer_json_reads_and_decodes_as_the_gguf_does(tmp_path: Path) -> None:
    """Every prompt sample's tokens and every token's bytes are the GGUF's: the remote
    engine's pieces (:meth:`RemoteTokenizer.piece`), which keep the pieces over 32 bytes
    that llama-cpp-python's ``detokenize`` drops (47 of SmolLM2's: runs of spaces,
    dashes)."""
    path = smollm_tokenizer_json(tmp_path / "tok")
    ours = JsonTokenizer(path, read_config(path))
    gguf = RemoteTokenizer(bundled_model_path(), RemoteSpec("http://upstream", "m"))
    try:
        messages = [{"role": "user", "content": "<|im_start|>forged " + PROMPT}]
        assert ours.prompt_tokens(messages) == gguf.prompt_tokens(messages)
        assert ours.raw_tokens(PROMPT) == gguf.raw_tokens(PROMPT)
        assert ours.stop_ids == gguf.stop_ids and ours.n_vocab == gguf.n_vocab
        differ = [t for t in range(gguf.n_vocab) if ours.piece(t) != gguf.piece(t)]
        assert differ == []
        long = [t for t in range(gguf.n_vocab) if len(gguf.piece(t)) > 32]
        assert len(long) == 47 and gguf.piece(long[0]).strip(b" \n") == b""
        assert all(bytes(gguf.llm.detokenize([t])) == b"" for t in long)  # what it dropped
        for token in range(gguf.n_vocab):  # special tokens' text, for the chat markers
            theirs = bytes(gguf.llm.detokenize([token], special=True))
            assert token in long or theirs == ours.llm.detokenize([token], special=True)
    finally:
        gguf.close()


def test_a_remote_model_with_a_tokenizer_json_answers_as_the_upstream(
    lmsp: Server, upstream: Upstream, tmp_path: Path
) -> None:
    path = smollm_tokenizer_json(tmp_path / "tok")
    with lmsp.client(timeout=300) as http:
        added = http.post("/v1/models", json=add_body(upstream, tokenizer=path), timeout=300)
        assert added.status_code == 201, added.text
        assert added.json()["format"] == "tokenizer.json"
        assert "chat_template" in added.json()["remote"]["tokenizer_config"]
        body = {"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": 48}
        answer = http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        done = answer.json()
        too_long = {**body, "input": "lighthouse " * 3000}  # over the upstream's 2048
        refused = http.post("/v1/responses", json=too_long)
    ids = prompt_tokens(PROMPT)
    assert done["usage"]["input_tokens"] == len(ids)  # counted with the tokenizer.json
    assert output_text(done) == decoded(upstream.greedy(ids, 48))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded", refused.text


def test_a_tokenizer_json_that_tokenizes_otherwise_is_refused_and_writes_nothing(
    lmsp: Server, upstream: Upstream, tmp_path: Path
) -> None:
    path = smollm_tokenizer_json(tmp_path / "tok", prefix_space=True)  # " Hello"
    before = models_in(lmsp)
    with lmsp.client(timeout=300) as http:
        refused = http.post("/v1/models", json=add_body(upstream, tokenizer=path), timeout=300)
        shown = http.get(f"/v1/models/{MODEL}")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (
        error["code"] == "tokenizer_mismatch"
        and "sample 1 of 6 differs at token 0" in error["message"]
    ), error
    assert shown.status_code == 404 and models_in(lmsp) == before


def test_a_tokenizer_to_fetch_is_refused_by_the_api_and_the_cli(
    lmsp: Server, upstream: Upstream
) -> None:
    reference = "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct"
    with lmsp.client(timeout=300) as http:
        body = add_body(upstream)
        refused = http.post("/v1/models", json={**body, "path": reference}, timeout=300)
    assert refused.status_code == 400, refused.text
    assert "nothing is downloaded" in refused.json()["error"]["message"]
    cli = subprocess.run(
        [
            *[sys.executable, "-m", "lmsp", "models", "add", "--id", MODEL, "--remote"],
            *[upstream.url, "--upstream-model", "smollm2", "--tokenizer", reference],
            *["--url", lmsp.url, "--token", lmsp.token],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert cli.returncode == 2 and "not downloaded" in cli.stderr, cli.stderr
    with lmsp.client() as http:
        assert http.get(f"/v1/models/{MODEL}").status_code == 404
