"""A token's bytes as the local engine writes them (:meth:`LlamaTokenizer.piece`): the
pieces over 32 bytes (47 of SmolLM2's: runs of spaces after a new line, of dashes, of
``#``) are whole, where llama-cpp-python's ``detokenize`` gave the stale bytes of its
32-byte buffer. The engine decodes every generated token, a resumed sequence's tokens
and a log-probability's bytes through it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_cpp import LlamaTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[LlamaTokenizer]:
    tok = LlamaTokenizer(bundled_model_path(), 0)
    yield tok
    tok.llm.close()


def test_a_piece_over_32_bytes_is_whole(tokenizer: LlamaTokenizer) -> None:
    long = [t for t in range(tokenizer.n_vocab) if len(tokenizer.piece(t)) > 32]
    assert len(long) == 47
    for token in long:
        piece = tokenizer.piece(token)
        # the piece tokenizes back to itself: its bytes are the token's, not stale ones
        assert tokenizer.llm.tokenize(piece, add_bos=False, special=False) == [token]
        assert bytes(tokenizer.llm.detokenize([token])) != piece  # what was written before


def test_generated_tokens_join_into_their_text(tokenizer: LlamaTokenizer) -> None:
    text = "def f():\n" + " " * 40 + "return 1\n# " + "-" * 48 + "\n"
    tokens = tokenizer.llm.tokenize(text.encode(), add_bos=False, special=False)
    assert any(len(tokenizer.piece(t)) > 32 for t in tokens)
    assert tokenizer.text_of(tokens) == text.encode()
    assert bytes(tokenizer.llm.detokenize(tokens)) != text.encode()


def test_short_and_control_pieces_are_as_before(tokenizer: LlamaTokenizer) -> None:
    for token in range(0, tokenizer.n_vocab, 97):
        if len(tokenizer.piece(token, special=True)) <= 32:
            assert tokenizer.piece(token) == bytes(tokenizer.llm.detokenize([token]))
            special = bytes(tokenizer.llm.detokenize([token], special=True))
            assert tokenizer.piece(token, special=True) == special
