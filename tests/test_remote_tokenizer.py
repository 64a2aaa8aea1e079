"""A remote model whose tokenizer is a ``tokenizer.json`` (docs/remote-engines.md), as for
a vLLM or SGLang upstream serving a Hugging Face model with no GGUF at hand — through the
real server against a real ``llama-server`` (:mod:`tests.upstream`).

The ``tokenizer.json`` is the bundled model's, built offline from its GGUF's vocabulary
and merges (:func:`tests.remote_fixtures.smollm_tokenizer_json`): it is checked against
the upstream's ``/tokenize`` when the model is added, counts a prompt's tokens as the
GGUF does, and decodes the upstream's greedy answer to the same text. One that tokenizes
otherwise is refused. A tokenizer named by a hub reference (``hf.co/…``, a stand-in of
the hub on loopback: :mod:`tests.hub_standin`) is fetched — a tokenizer.json, or a GGUF
file's vocabulary alone — and checked the same way."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.hf_tokenizer import JsonTokenizer, read_config
from lmsp.engines.remote import RemoteTokenizer
from lmsp.engines.upstream import RemoteSpec
from tests import remote_fixtures
from tests.helpers import Server, open_db, seeded_data_dir
from tests.hub_standin import COMMIT, Hub, HubFile, serve, sha256_of
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


REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_REPO = "someone/SmolLM2-135M-Instruct-GGUF"


@contextlib.contextmanager
def hub_and_lmsp(
    tmp_path: Path, blob_cache: Path, files: list[HubFile], repo: str = REPO
) -> Iterator[tuple[Hub, Server]]:
    """A hub stand-in on loopback serving ``files`` as ``repo``, and a real ``lmsp
    serve`` that fetches from it (``LMSP_HF_ENDPOINT``)."""
    hub = serve(Hub(repo, files))
    data = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data, env={"LMSP_PARALLEL": "2", "LMSP_HF_ENDPOINT": hub.url})
    try:
        server.start()
        yield hub, server
    finally:
        server.stop()
        hub.close()


def json_files(folder: Path, lfs: bool = False) -> list[HubFile]:
    """The bundled model's tokenizer.json and tokenizer_config.json as a hub lists them
    (git blobs, or ``lfs``), and its weights listed but never served."""
    path = smollm_tokenizer_json(folder)
    config = path.with_name("tokenizer_config.json")
    return [
        HubFile(
            "tokenizer.json", path, path.stat().st_size, sha256_of(path) if lfs else "", lfs=lfs
        ),
        HubFile("tokenizer_config.json", config, config.stat().st_size, "", lfs=False),
        HubFile("model.safetensors", None, 269_060_552, "0" * 64),
    ]


def fetching_left(server: Server) -> list[Path]:
    folder = server.data_dir / "fetching"
    return list(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("lfs", [False, True])
def test_a_tokenizer_json_named_by_a_hub_reference_is_fetched_checked_and_answers(
    upstream: Upstream, tmp_path: Path, blob_cache: Path, lfs: bool
) -> None:
    """``hf.co/{owner}/{repo}`` of a Hugging Face model (as vLLM serves it): its
    tokenizer.json and tokenizer_config.json fetched (each checked against the hash the
    hub lists), never its weights; the model then answers as the upstream does."""
    files = json_files(tmp_path / "tok", lfs=lfs)
    with hub_and_lmsp(tmp_path, blob_cache, files) as (hub, server):
        with server.client(timeout=300) as http:
            body = {**add_body(upstream), "path": f"hf.co/{REPO}"}
            added = http.post("/v1/models", json=body, timeout=300)
            assert added.status_code == 201, added.text
            answer = http.post(
                "/v1/responses",
                json={"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": 32},
            )
            assert answer.status_code == 200, answer.text
        left = fetching_left(server)
    model = added.json()
    assert model["format"] == "tokenizer.json"
    assert model["remote"]["tokenizer_origin"] == f"hf.co/{REPO}@{COMMIT}/tokenizer.json"
    assert "chat_template" in model["remote"]["tokenizer_config"]
    assert {r["path"] for r in hub.requests} == {"tokenizer.json", "tokenizer_config.json"}
    ids = prompt_tokens(PROMPT)
    assert output_text(answer.json()) == decoded(upstream.greedy(ids, 32))
    assert left == []


def test_a_gguf_reference_fetches_only_the_vocabulary_through_the_cli(
    upstream: Upstream, tmp_path: Path, blob_cache: Path
) -> None:
    """``hf.co/{owner}/{repo}:{quant}`` of a GGUF repository (as llama-server serves it),
    through ``lmsp models add``: the head of that GGUF file, read until its metadata
    ends, becomes the model's blob — a GGUF without tensors, not the 98 MB of weights."""
    source = bundled_model_path()
    size = source.stat().st_size
    files = [
        HubFile("SmolLM2-135M-Instruct-Q4_1.gguf", source, size, sha256_of(source)),
        HubFile("SmolLM2-135M-Instruct-Q8_0.gguf", None, 144_811_200, "1" * 64),
    ]
    with hub_and_lmsp(tmp_path, blob_cache, files, GGUF_REPO) as (hub, server):
        cli = subprocess.run(
            [
                *[sys.executable, "-m", "lmsp", "models", "add", "--id", MODEL, "--remote"],
                *[upstream.url, "--upstream-model", "smollm2", "--inflight", "2"],
                *["--tokenizer", f"hf.co/{GGUF_REPO}:Q4_1", "--url", server.url],
                *["--token", server.token],
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, COLUMNS="200"),
        )
        assert cli.returncode == 0, cli.stderr
        with server.client(timeout=300) as http:
            model = http.get(f"/v1/models/{MODEL}").json()
            answer = http.post(
                "/v1/responses",
                json={"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": 32},
            )
            assert answer.status_code == 200, answer.text
    assert model["format"] == "gguf" and model["size_bytes"] < 4 << 20, model
    origin = f"hf.co/{GGUF_REPO}@{COMMIT}/SmolLM2-135M-Instruct-Q4_1.gguf"
    assert model["remote"]["tokenizer_origin"] == origin
    assert [r["path"] for r in hub.requests] == ["SmolLM2-135M-Instruct-Q4_1.gguf"]
    ids = prompt_tokens(PROMPT)
    assert output_text(answer.json()) == decoded(upstream.greedy(ids, 32))
    assert answer.json()["usage"]["input_tokens"] == len(ids)


def test_a_tokenizer_the_hub_cannot_give_is_refused_and_writes_nothing(
    upstream: Upstream, tmp_path: Path, blob_cache: Path
) -> None:
    """A tokenizer.json whose hash is not the one listed (503 ``hub_error``), a repository
    with neither a tokenizer.json nor a GGUF file, a GGUF file that ends inside its
    metadata, a quantization the repository does not have (400), and an address that is
    not a hub reference (400, from the API and the CLI): each refused, nothing written
    (and what a crashed fetch left in the data directory is removed)."""
    tok = json_files(tmp_path / "tok")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(bundled_model_path().read_bytes()[: 1 << 20])  # the vocabulary goes on
    cases = {
        "a": [HubFile("tokenizer.json", tok[0].source, tok[0].size, "f" * 64, lfs=False)],
        "b": [HubFile("config.json", tok[1].source, tok[1].size, "", lfs=False)],
        "c": [HubFile("model-Q4_0.gguf", cut, 1 << 20, sha256_of(cut))],
    }
    hub = serve(Hub("x/a", cases["a"]))
    data = seeded_data_dir(tmp_path / "data", blob_cache)
    crashed = data / "fetching" / "tokenizer-left-by-a-crash"  # an hour old: removed
    crashed.mkdir(parents=True)
    (crashed / "tokenizer.json").write_text("{}")
    os.utime(crashed, (time.time() - 3600, time.time() - 3600))
    server = Server(data, env={"LMSP_HF_ENDPOINT": hub.url})
    try:
        server.start()
        with server.client(timeout=300) as http:
            got = {}
            for repo, case in (("a", ""), ("b", ""), ("c", ":Q4_0"), ("c", ":Q8_0")):
                hub.repo, hub.files = f"x/{repo}", cases[repo]
                body = {**add_body(upstream), "path": f"hf.co/x/{repo}{case}"}
                got[repo + case] = http.post("/v1/models", json=body, timeout=300)
            url = {**add_body(upstream), "path": "https://example.com/tokenizer.json"}
            got["url"] = http.post("/v1/models", json=url, timeout=300)
            listed = http.get("/v1/models").json()["data"]
        left = fetching_left(server)
    finally:
        server.stop()
        hub.close()
    codes = {k: (r.status_code, r.json()["error"]["code"]) for k, r in got.items()}
    assert codes == {
        "a": (503, "hub_error"),
        "b": (400, "invalid_request"),
        "c:Q4_0": (400, "invalid_request"),
        "c:Q8_0": (400, "quant_not_found"),
        "url": (400, "invalid_request"),
    }, {k: r.text for k, r in got.items()}
    assert "not the file it lists" in got["a"].json()["error"]["message"]
    assert "neither a tokenizer.json nor a GGUF" in got["b"].json()["error"]["message"]
    assert "ends before it" in got["c:Q4_0"].json()["error"]["message"]
    refused = [r.json()["error"]["param"] for r in got.values() if r.status_code == 400]
    assert refused == ["tokenizer"] * 4  # the hub's failure (503) names no parameter
    assert MODEL not in {m["id"] for m in listed} and left == []
    cli = subprocess.run(
        [
            *[sys.executable, "-m", "lmsp", "models", "add", "--id", MODEL, "--remote"],
            *[upstream.url, "--upstream-model", "smollm2"],
            *["--tokenizer", "https://example.com/tokenizer.json", "--url", "http://127.0.0.1:9"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert cli.returncode == 2 and "no other address is fetched" in cli.stderr, cli.stderr
