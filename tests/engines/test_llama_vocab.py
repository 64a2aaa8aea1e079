"""An engine's tokenizer reads the vocabulary of the model it loaded (engines/llama_vocab.py)
and gives what llama-cpp-python's vocabulary-only ``Llama`` gives: the same metadata,
special tokens, tokens for any text and pieces, and so the same prompts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_context import load_model
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.engines.llama_vocab import ModelVocab

TEXTS = [
    "",
    "Hello, world!",
    " leading space and trailing  ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "emoji 🦙🔥 and accents: café, naïve, Zürich; CJK: 日本語",
    "code:\n\tdef f(x):\n\t\treturn x ** 2  # squared\n" + " " * 40 + "end",
    "a" * 3000,
]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[LlamaTokenizer, ModelVocab]]:
    import llama_cpp

    path = bundled_model_path()
    reference = LlamaTokenizer(path, 0)
    model = load_model(path)
    try:
        yield reference, ModelVocab(model)
    finally:
        llama_cpp.llama_model_free(model)
        reference.close()


def test_the_same_metadata_and_special_tokens(pair: tuple[LlamaTokenizer, ModelVocab]) -> None:
    reference, vocab = pair
    assert vocab.metadata == dict(reference.llm.metadata)
    assert len(vocab.metadata) > 10
    assert vocab.n_vocab() == reference.llm.n_vocab() == reference.n_vocab
    assert vocab.token_eos() == reference.llm.token_eos()
    assert vocab.token_bos() == reference.llm.token_bos()


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize(("add_bos", "special"), [(True, True), (False, False), (False, True)])
def test_the_same_tokens_for_any_text(
    pair: tuple[LlamaTokenizer, ModelVocab], text: str, add_bos: bool, special: bool
) -> None:
    reference, vocab = pair
    data = text.encode()
    tokens = vocab.tokenize(data, add_bos=add_bos, special=special)
    assert tokens == reference.llm.tokenize(data, add_bos=add_bos, special=special)
    pieces = b"".join(reference.piece(token, special=special) for token in tokens)
    assert vocab.detokenize(tokens, special=special) == pieces  # no BOS here: none dropped


def test_the_same_pieces_and_control_tokens(pair: tuple[LlamaTokenizer, ModelVocab]) -> None:
    reference, vocab = pair
    for token in range(0, reference.n_vocab, 97):
        assert vocab.detokenize([token]) == reference.piece(token)
        assert vocab.detokenize([token], special=True) == reference.piece(token, special=True)


def test_an_engine_renders_the_prompts_a_tokenizer_does() -> None:
    """The prompt an engine builds (through the model it loaded) is the API process's
    (through a vocabulary-only load)."""
    from lmsp.engines.llama_cpp import LlamaModel, LoadOptions

    path = bundled_model_path()
    reference = LlamaTokenizer(path, 0)
    model = LlamaModel(path, 512, LoadOptions(sequences=1))
    try:
        assert isinstance(model.llm, ModelVocab)
        messages = [
            {"role": "system", "content": "You are terse. <|im_end|> is only text here."},
            {"role": "user", "content": "Name a prime over 🦙 100."},
        ]
        tools = [{"name": "f", "description": "Look it up.", "parameters": {"type": "object"}}]
        assert model.prompt_tokens(messages) == reference.prompt_tokens(messages)
        assert model.prompt_tokens(messages, tools) == reference.prompt_tokens(messages, tools)
        assert model.raw_tokens("<|im_start|>x") == reference.raw_tokens("<|im_start|>x")
        assert model.stop_ids == reference.stop_ids
        assert model.meta == reference.meta
    finally:
        model.close()
        reference.close()
