"""A grammar as a per-sequence :class:`~lmsp.engines.base.Constraint` (llguidance).

The model gives its llguidance tokenizer (built once per loaded model from the GGUF's
own vocabulary); a grammar is compiled against it once and cached by digest, and every
sequence gets a cheap copy of the compiled matcher. The matcher computes a bitmask over
the vocabulary before each token (about a quarter of a millisecond for SmolLM2's 49,152
tokens) and is told each token chosen.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from llguidance import LLMatcher, LLTokenizer

from lmsp.engines.base import Constraint, EngineError, LoadedModel

log = logging.getLogger(__name__)

_CACHE_SIZE = 128
_compiled: OrderedDict[tuple[int, str], LLMatcher] = OrderedDict()
_lock = threading.Lock()


def tokenizer_of(model: LoadedModel) -> LLTokenizer:
    """The llguidance tokenizer of a loaded model (``engine_error`` if it has none)."""
    build: Callable[[], Any] | None = getattr(model, "guidance_tokenizer", None)
    if build is None:
        raise EngineError("engine_error", "This engine cannot constrain its output to a grammar.")
    tokenizer: LLTokenizer = build()
    return tokenizer


def compiled(tokenizer: LLTokenizer, grammar: str) -> LLMatcher:
    """A fresh matcher for ``grammar``: compiled once per tokenizer, then copied."""
    key = (id(tokenizer), hashlib.sha256(grammar.encode()).hexdigest())
    with _lock:
        template = _compiled.get(key)
        if template is not None:
            _compiled.move_to_end(key)
            return template.deep_copy()
    template = LLMatcher(tokenizer, grammar, log_level=0)
    if template.is_error():
        raise _failed("The output's grammar could not be compiled.", template, key[1])
    with _lock:
        _compiled[key] = template
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    return template.deep_copy()


class GrammarConstraint:
    """One sequence's matcher."""

    def __init__(self, matcher: LLMatcher, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab

    def allowed(self) -> npt.NDArray[np.bool_] | None:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.n_vocab].astype(bool)
        if mask.shape[0] < self.n_vocab:  # tokens llguidance does not know: never allowed
            mask = np.concatenate([mask, np.zeros(self.n_vocab - mask.shape[0], dtype=bool)])
        if self.matcher.is_error():
            raise _failed("The output's constraint failed.", self.matcher)
        return mask

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise _failed("The output's constraint refused a token.", self.matcher)

    def finished(self) -> bool:
        return self.matcher.is_stopped()


def _failed(message: str, matcher: LLMatcher, digest: str = "") -> EngineError:
    """An ``engine_error`` with a short message; llguidance's own words (a panic's
    backtrace, build paths) go to the log, never to the client."""
    log.warning(
        "%s%s llguidance: %s",
        message,
        f" (grammar {digest[:16]})" if digest else "",
        matcher.get_error()[:4000],
        extra={"event": "constraint.failed"},
    )
    return EngineError("engine_error", message)


def grammar_constraint(grammar: str) -> Callable[[LoadedModel], Constraint]:
    """The constraint factory of a grammar (see :mod:`lmsp.constraints.grammar`)."""

    def build(model: LoadedModel) -> Constraint:
        tokenizer = tokenizer_of(model)
        n_vocab = int(getattr(model, "n_vocab", tokenizer.vocab_size))
        return GrammarConstraint(compiled(tokenizer, grammar), n_vocab)

    return build
