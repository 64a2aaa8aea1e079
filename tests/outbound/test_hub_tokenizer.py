"""A remote model's tokenizer fetched from the hub (:mod:`lmsp.outbound.hub_tokenizer`),
against the hub stand-in on loopback (tests/hub_standin.py): which file a reference
picks, the vocabulary-only GGUF it writes (the bundled model's tokenizer, read by
llama.cpp, tokenizes as the whole file does), and a hub that trickles cut off in time.
The end-to-end cases, through the real server and a real upstream, are in
tests/test_remote_tokenizer.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp import errors
from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.outbound import hub_tokenizer
from lmsp.outbound.hub import Hub as HubClient
from tests.hub_standin import COMMIT, Hub, HubFile, serve, sha256_of

REPO = "someone/Smol-GGUF"


@pytest.fixture
def standin() -> Iterator[Hub]:
    hub = serve(Hub(REPO, []))
    try:
        yield hub
    finally:
        hub.close()


def gguf(name: str, source: Path | None = None) -> HubFile:
    path = source or bundled_model_path()
    return HubFile(name, path, path.stat().st_size, sha256_of(path))


def test_the_vocabulary_of_a_gguf_file_tokenizes_as_the_whole_file(
    standin: Hub, tmp_path: Path
) -> None:
    standin.files = [gguf("Smol-Q4_1.gguf")]
    with HubClient(standin.url) as client:
        fetched = hub_tokenizer.fetch(client, f"hf.co/{REPO}", tmp_path)
    assert fetched.origin == f"hf.co/{REPO}@{COMMIT}/Smol-Q4_1.gguf"
    assert fetched.path.stat().st_size < 2 << 20  # of 98 MB
    texts = ["Hello, world!", "café 日本語 🙂", "<|im_start|>user\nhi<|im_end|>\n"]
    ours, whole = LlamaTokenizer(fetched.path, 0), LlamaTokenizer(bundled_model_path(), 0)
    try:
        assert ours.n_vocab == whole.n_vocab and ours.stop_ids == whole.stop_ids
        for text in texts:
            assert ours.raw_tokens(text) == whole.raw_tokens(text)
        chat = [{"role": "user", "content": texts[1]}]
        assert ours.prompt_tokens(chat) == whole.prompt_tokens(chat)
    finally:
        ours.close()
        whole.close()


def test_without_a_quantization_the_default_one_else_the_first_listed(
    standin: Hub, tmp_path: Path
) -> None:
    """The vocabulary is the same in every quantization: without one named, the
    default's file (Q4_K_M), else the first GGUF file listed (a split file's first part),
    never a projector; a quantization named is that one's."""
    listed = [
        gguf("b-Q8_0-00001-of-00002.gguf"),
        HubFile("b-Q8_0-00002-of-00002.gguf", None, 5, "2" * 64),
        HubFile("a-mmproj-f16.gguf", None, 5, "3" * 64),
    ]
    standin.files = listed
    with HubClient(standin.url) as client:
        first = hub_tokenizer.fetch(client, f"hf.co/{REPO}", tmp_path / "1")
        standin.files = [*listed, gguf("c-Q4_K_M.gguf")]
        default = hub_tokenizer.fetch(client, f"hf.co/{REPO}", tmp_path / "2")
        named = hub_tokenizer.fetch(client, f"hf.co/{REPO}:Q8_0", tmp_path / "3")
    assert first.path.name == "b-Q8_0-00001-of-00002.gguf"
    assert default.path.name == "c-Q4_K_M.gguf"
    assert named.path.name == "b-Q8_0-00001-of-00002.gguf"


def test_a_hub_that_trickles_is_cut_off(
    standin: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin.files = [gguf("Smol-Q4_1.gguf")]
    standin.trickle = 0.5  # the first 64 KiB, then a byte each half second
    monkeypatch.setattr(hub_tokenizer, "FETCH_FOR", 1.5)
    began = time.monotonic()
    with HubClient(standin.url) as client, pytest.raises(errors.LmspError) as refused:
        hub_tokenizer.fetch(client, f"hf.co/{REPO}:Q4_1", tmp_path)
    assert refused.value.code == "hub_error"
    assert "took over 1.5 s" in refused.value.message
    assert time.monotonic() - began < 10
