"""A remote model's tokenizer given as a Hugging Face ``tokenizer.json`` (the
``tokenizers`` library), for upstreams such as vLLM and SGLang that serve a model with
no GGUF at hand (docs/remote-engines.md).

It offers what the remote engine and the API process use of a GGUF's tokenizer
(:class:`lmsp.engines.llama_cpp.LlamaTokenizer`): prompts formatted with the chat
template and tokenized with only the template's markers as control tokens
(:mod:`lmsp.engines.markers`), raw prompts with special tokens read as such, and each
token's *bytes* (not its text: a byte-level token may hold part of a UTF-8 character,
which :class:`lmsp.engines.base.Utf8Stream` holds back until it is whole). The chat
template, BOS and EOS come from the ``tokenizer_config.json`` beside the file, read
when the model is added (:func:`read_config`) and kept with the model's record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lmsp.engines import markers
from lmsp.protocol import toolprompt

#: the first bytes of a GGUF file (anything else given as a tokenizer is read as JSON)
GGUF_MAGIC = b"GGUF"
#: a byte-fallback token of a SentencePiece-style vocabulary
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def is_gguf(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars = list(kept)
    extra = 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(kept, chars, strict=True)}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` gives it: a string or ``{content}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_config(path: Path) -> dict[str, Any]:
    """What lmsp keeps of the ``tokenizer_config.json`` (and ``generation_config.json``)
    beside a ``tokenizer.json``: the chat template, the BOS and EOS tokens' text, the
    ids that end a generation. Empty when there is none (the fallback template then)."""
    found: dict[str, Any] = {}
    config = path.with_name("tokenizer_config.json")
    if config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        template = data.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str):
            found["chat_template"] = template
        for name in ("bos_token", "eos_token"):
            text = _token_text(data.get(name))
            if text is not None:
                found[name] = text
    generation = path.with_name("generation_config.json")
    if generation.is_file():
        eos = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
        ids = eos if isinstance(eos, list) else [eos]
        found["eos_ids"] = [int(i) for i in ids if isinstance(i, int)]
    return found


class JsonVocab:
    """``tokenize`` and ``detokenize`` as llama-cpp-python's ``Llama`` has them (bytes in
    and out), over a ``tokenizers.Tokenizer``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        text = path.read_text(encoding="utf-8")
        self.parsing = Tokenizer.from_str(text)  # special tokens read as such
        self.plain = Tokenizer.from_str(text)  # every special token's text as plain text
        self.plain.encode_special_tokens = True
        spec = json.loads(text)
        size = self.parsing.get_vocab_size(with_added_tokens=True)
        added = {int(t["id"]): t for t in spec.get("added_tokens") or []}
        self.control = {t["content"]: i for i, t in added.items() if t.get("special")}
        size = max(size, *(i + 1 for i in added)) if added else size
        byte_level = '"ByteLevel"' in json.dumps(spec.get("decoder"))
        table = _byte_decoder() if byte_level else None
        self.pieces: list[bytes] = []
        self.special: list[bytes] = []
        for token in range(size):
            text_of = self.parsing.id_to_token(token) or ""
            if token in added:
                data = text_of.encode("utf-8")
                self.special.append(data)
                self.pieces.append(b"" if added[token].get("special") else data)
                continue
            data = _bytes_of(text_of, table)
            self.pieces.append(data)
            self.special.append(data)

    def n_vocab(self) -> int:
        return len(self.pieces)

    def tokenize(self, data: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        tokenizer = self.parsing if special else self.plain
        ids: list[int] = tokenizer.encode(
            data.decode("utf-8", errors="replace"), add_special_tokens=add_bos
        ).ids
        return ids

    def detokenize(
        self, tokens: list[int], prev_tokens: Any = None, special: bool = False
    ) -> bytes:
        table = self.special if special else self.pieces
        return b"".join(table[t] for t in tokens if 0 <= t < len(table))

    def close(self) -> None:
        return None


def _bytes_of(token: str, table: dict[str, int] | None) -> bytes:
    """A vocabulary token's bytes: through the byte-level alphabet, or SentencePiece's
    (``▁`` a space, ``<0xNN>`` one byte)."""
    if table is not None and all(c in table for c in token):
        return bytes(table[c] for c in token)
    byte = _BYTE_TOKEN.fullmatch(token)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


class JsonTokenizer:
    """A model's chat template and tokenizer from a ``tokenizer.json`` and the
    configuration read beside it (:func:`read_config`), as a GGUF's would be."""

    n_embd = 0  # the embeddings' length is the upstream's

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from lmsp.engines.llama_cpp import FALLBACK_TEMPLATE

        self.llm = JsonVocab(path)
        self.n_vocab = self.llm.n_vocab()
        self.n_ctx = 0
        self.meta: dict[str, str] = {}
        eos_text = str(config.get("eos_token") or "")
        self.stop_ids = {i for i in config.get("eos_ids") or [] if 0 <= i < self.n_vocab}
        eos = self.llm.control.get(eos_text)
        if eos is not None:
            self.stop_ids.add(eos)
        self.eos = eos if eos is not None else -1
        self.eog = set(self.stop_ids)
        template = str(config.get("chat_template") or FALLBACK_TEMPLATE)
        self.template_tools = toolprompt.supports_tools(template)
        self.control_markers: markers.Markers | None = markers.Markers(self.llm.control)
        self.formatter = Jinja2ChatFormatter(
            template=template, eos_token=eos_text, bos_token=str(config.get("bos_token") or "")
        )

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        from lmsp.protocol import completions

        raw = completions.raw_prompt(messages)
        if raw is not None:
            return self.raw_tokens(raw)
        return markers.prompt_tokens(self, messages, tools)

    def raw_tokens(self, text: str) -> list[int]:
        """As :meth:`lmsp.engines.llama_cpp.LlamaTokenizer.raw_tokens`: the tokenizer's
        own special tokens added (a BOS if its post-processor adds one), special tokens
        in the text read as such."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def text_tokens(self, text: str) -> list[int]:
        return self.raw_tokens(text)

    def piece(self, token: int) -> bytes:
        """``token``'s bytes, as the model writes it (a special token's: none)."""
        pieces = self.llm.pieces
        return pieces[token] if 0 <= token < len(pieces) else b""

    def close(self) -> None:
        return None
