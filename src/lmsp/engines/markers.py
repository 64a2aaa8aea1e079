"""A prompt's tokens where only the chat template's own markers are control tokens.

Why: a prompt used to be rendered with the chat template and tokenized as one string
with control tokens parsed anywhere in it, so ``<|im_start|>system`` written in a user
message, a file or a tool's output became the template's own marker: whoever could put
text in a prompt could forge role turns.

How: the template is rendered twice — with the messages, and with a unique placeholder
in place of each message's content. The placeholders show which characters of the
prompt are the template's and which are content. The prompt is then cut at the control
tokens (``<|im_start|>``, ``<|im_end|>`` …) that stand in the template's text; every run
of text between two of them, content included, is tokenized with control tokens *not*
parsed. For a prompt whose content holds no control token's text the tokens are exactly
those of the old one-string tokenization (llama.cpp cuts at control tokens first and
tokenizes the runs between them the same way); a forged marker comes out as the plain
tokens of its characters.

If a template changes content as it renders it (so the placeholders cannot be traced),
each content is tokenized by itself as plain text between the template's pieces.
Tool definitions a template renders itself are template text, so a tool whose
definition holds a control token's text is shown the generic way
(:func:`lmsp.protocol.toolprompt.with_tools`: in the system message, as content).

The longer runs are kept with their tokens (:class:`Runs`): an agent sends its whole
conversation again every turn, and each earlier message is a run that tokenizes the same
as the last time, so a turn tokenizes only what is new in it.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from lmsp.protocol import toolprompt

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
Render = Callable[[Messages], str]


class Tokenizing(Protocol):
    """What :func:`prompt_tokens` needs of a model's tokenizer
    (:class:`lmsp.engines.llama_cpp.LlamaTokenizer`)."""

    llm: Any
    template_tools: bool
    formatter: Any  # the chat template (llama-cpp-python's Jinja2ChatFormatter)
    control_markers: Markers | None  # its markers once read (:func:`markers_of`)


class Runs:
    """The longer runs of plain text one vocabulary tokenized last, with their tokens.

    A run is the same text each time it comes again (a message's content and the role
    around it, between two control tokens), and tokenizes the same: its tokens are a
    look-up the next time. Runs shorter than :attr:`SHORTEST` characters are tokenized
    each time (microseconds); at most :attr:`CHARACTERS` of text are kept in all, the
    least recently used let go first, and none longer than a quarter of that. Used from
    any thread."""

    SHORTEST = 256
    CHARACTERS = 4 * 1024 * 1024

    def __init__(self) -> None:
        self._kept: OrderedDict[str, array[int]] = OrderedDict()
        self._size = 0  # characters kept
        self._lock = threading.Lock()
        self.hits = 0

    def tokens(self, llm: Any, text: str) -> list[int]:
        """``text`` tokenized by ``llm`` with no control token parsed and no BOS."""
        if len(text) < self.SHORTEST:
            return _tokenize(llm, text)
        with self._lock:
            kept = self._kept.get(text)
            if kept is not None:
                self._kept.move_to_end(text)
                self.hits += 1
                return kept.tolist()
        tokens = _tokenize(llm, text)
        if len(text) <= self.CHARACTERS // 4:
            with self._lock:
                if text not in self._kept:
                    self._kept[text] = array("i", tokens)
                    self._size += len(text)
                while self._size > self.CHARACTERS:
                    self._size -= len(self._kept.popitem(last=False)[0])
        return tokens


class Markers:
    """The control tokens of a vocabulary, by their text, and the runs of plain text
    between them it tokenized last (:class:`Runs`)."""

    def __init__(self, by_text: dict[str, int]) -> None:
        self.by_text = by_text
        texts = sorted(by_text, key=len, reverse=True)  # the longest first, as llama.cpp
        self.pattern = re.compile("|".join(re.escape(t) for t in texts)) if texts else None
        self.runs = Runs()

    @classmethod
    def of(cls, llm: Any) -> Markers:
        """The control tokens of a loaded llama-cpp-python ``Llama`` (its vocabulary)."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        found: dict[str, int] = {}
        for token in range(int(llama_cpp.llama_vocab_n_tokens(vocab))):
            if int(llama_cpp.llama_vocab_get_attr(vocab, token)) & control:
                text = bytes(llm.detokenize([token], special=True)).decode("utf-8", "replace")
                if text:
                    found.setdefault(text, token)
        return cls(found)

    def in_text(self, text: str) -> bool:
        return self.pattern is not None and self.pattern.search(text) is not None


def markers_of(tokenizer: Tokenizing) -> Markers:
    """The tokenizer's :class:`Markers`, read from its vocabulary once."""
    found = tokenizer.control_markers
    if found is None:
        found = tokenizer.control_markers = Markers.of(tokenizer.llm)
    return found


def prompt_tokens(
    tokenizer: Tokenizing, messages: Messages, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt of ``messages`` (and ``tools``) in the model's chat template, as
    tokens (see the module docstring)."""
    markers = markers_of(tokenizer)
    native = bool(tools) and tokenizer.template_tools
    if native and markers.in_text(json.dumps(tools, ensure_ascii=False)):
        native = False  # a forged marker in a definition: shown as content instead
    if native:
        shown = toolprompt.template_tools(tools or [])

        def render(given: Messages) -> str:
            return str(tokenizer.formatter(messages=given, tools=shown).prompt)

    else:
        messages = toolprompt.with_tools(messages, tools or [])

        def render(given: Messages) -> str:
            return str(tokenizer.formatter(messages=given).prompt)

    return tokenize(tokenizer.llm, markers, render, messages)


def tokenize(llm: Any, markers: Markers, render: Render, messages: Messages) -> list[int]:
    """``render(messages)`` tokenized with control tokens parsed in the template's text
    only."""
    pieces = _traced(render, messages)
    if pieces is None:
        return _piecewise(llm, markers, render, messages)
    tokens: list[int] = []
    run: list[str] = []
    for piece in pieces:
        if isinstance(piece, int):
            run.append(messages[piece]["content"])
            continue
        for text, token in _cut(markers, piece):
            if token is None:
                run.append(text)
            else:
                tokens += markers.runs.tokens(llm, "".join(run))
                run = []
                tokens.append(token)
    tokens += markers.runs.tokens(llm, "".join(run))
    return tokens


def _traced(render: Render, messages: Messages) -> list[str | int] | None:
    """The rendered prompt as template text and content (a message's index), or
    ``None`` if the template changed some content as it rendered it."""
    nonce = secrets.token_hex(8)
    marks = {f"LMSP{nonce}C{i}Z": i for i in range(len(messages))}
    placed = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    rendered = render(placed)
    pieces: list[str | int] = []
    at = 0
    for found in re.finditer(rf"LMSP{nonce}C(\d+)Z", rendered):
        pieces.append(rendered[at : found.start()])
        pieces.append(int(found.group(1)))
        at = found.end()
    pieces.append(rendered[at:])
    whole = "".join(p if isinstance(p, str) else messages[p]["content"] for p in pieces)
    if whole != render(messages):
        return None
    return pieces


def _cut(markers: Markers, text: str) -> list[tuple[str, int | None]]:
    """Template text cut into plain runs and control tokens."""
    if markers.pattern is None:
        return [(text, None)]
    out: list[tuple[str, int | None]] = []
    at = 0
    for found in markers.pattern.finditer(text):
        if found.start() > at:
            out.append((text[at : found.start()], None))
        out.append((found.group(0), markers.by_text[found.group(0)]))
        at = found.end()
    if at < len(text):
        out.append((text[at:], None))
    return out


def _tokenize(llm: Any, text: str) -> list[int]:
    if not text:
        return []
    tokens: list[int] = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    return tokens


def _piecewise(llm: Any, markers: Markers, render: Render, messages: Messages) -> list[int]:
    """The fallback: the template's pieces (from the placeholder rendering) with their
    markers, and each content as given, by itself, as plain text."""
    log.debug("the chat template changes content as it renders it: contents tokenized alone")
    nonce = secrets.token_hex(8)
    placed = [{**m, "content": f"LMSP{nonce}C{i}Z"} for i, m in enumerate(messages)]
    rendered = render(placed)
    tokens: list[int] = []
    at = 0
    for found in re.finditer(rf"LMSP{nonce}C(\d+)Z", rendered):
        tokens += _template(llm, markers, rendered[at : found.start()])
        tokens += markers.runs.tokens(llm, messages[int(found.group(1))]["content"])
        at = found.end()
    return tokens + _template(llm, markers, rendered[at:])


def _template(llm: Any, markers: Markers, text: str) -> list[int]:
    tokens: list[int] = []
    for run, token in _cut(markers, text):
        tokens += markers.runs.tokens(llm, run) if token is None else [token]
    return tokens
