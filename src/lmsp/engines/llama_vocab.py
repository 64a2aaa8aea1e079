"""The vocabulary and metadata of a model an engine has loaded, read through that model.

:class:`~lmsp.engines.llama_cpp.LlamaTokenizer` reads them through llama-cpp-python's
``Llama``, which loads the model file itself: vocabulary-only where only a tokenizer is
needed (the API process). An engine loads the whole model for its context anyway, so
:class:`ModelVocab` gives the tokenizer the same calls on that model instead of a second
load of the file (0.08-0.1 s of every engine's start, a resume after a crash included).
The calls are llama-cpp-python's own, made on the model's vocabulary.
"""

from __future__ import annotations

import ctypes
from typing import Any


class ModelVocab:
    """What :class:`~lmsp.engines.llama_cpp.LlamaTokenizer` uses of a ``Llama``, over a
    loaded ``llama_model`` it does not own (the context that loaded it frees it)."""

    def __init__(self, model: Any) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.metadata = _metadata(llama_cpp, model)

    def n_vocab(self) -> int:
        return int(self._lib.llama_vocab_n_tokens(self.vocab))

    def token_eos(self) -> int:
        return int(self._lib.llama_vocab_eos(self.vocab))

    def token_bos(self) -> int:
        return int(self._lib.llama_vocab_bos(self.vocab))

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        lib = self._lib
        room = len(text) + 2  # a token per byte at most, and the BOS and EOS around them
        tokens = (lib.llama_token * room)()
        n = lib.llama_tokenize(self.vocab, text, len(text), tokens, room, add_bos, special)
        if n < 0:  # not in fact enough: llama.cpp says how many
            room = -n
            tokens = (lib.llama_token * room)()
            n = lib.llama_tokenize(self.vocab, text, len(text), tokens, room, add_bos, special)
            if n < 0:
                raise RuntimeError(f"llama.cpp could not tokenize {len(text)} bytes")
        return list(tokens[:n])

    def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        """The tokens' pieces joined; a leading space after a BOS dropped, as
        llama-cpp-python does (its 32-byte buffer's limit left out)."""
        out = b"".join(self._piece(token, special) for token in tokens)
        if tokens and tokens[0] == self.token_bos() and out[:1] == b" ":
            return out[1:]
        return out

    def _piece(self, token: int, special: bool) -> bytes:
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_token_to_piece(self.vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def close(self) -> None:
        """Nothing of its own to free: the model is its context's."""


def _metadata(lib: Any, model: Any) -> dict[str, str]:
    """The model's metadata as strings, as ``Llama.metadata`` reads it."""
    found: dict[str, str] = {}
    for i in range(int(lib.llama_model_meta_count(model))):
        key = _string(lib.llama_model_meta_key_by_index, model, i)
        found[key] = _string(lib.llama_model_meta_val_str_by_index, model, i)
    return found


def _string(read: Any, model: Any, index: int) -> str:
    """A string llama.cpp writes into a buffer (its length returned, as ``snprintf``
    does): read again into a larger buffer until it holds it all."""
    size = 1024
    while True:
        buf = ctypes.create_string_buffer(size)
        n = int(read(model, index, buf, size))
        if n < size:
            return buf.value.decode("utf-8")
        size = n + 1
