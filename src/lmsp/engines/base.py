"""The engine interface.

An engine loads a model file into a :class:`LoadedModel`, which turns messages into
prompt tokens and yields generated tokens one at a time. ``generate`` takes the tokens
already produced (from a snapshot) and continues after them, so a resumed task picks
up exactly where its last persisted event left off. Sampling is keyed by
``(seed, position)``, never by hidden RNG state, so a resumed run draws the same
tokens an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt


class EngineError(Exception):
    """A failure with a protocol error code (``engine_error``, ``context_length_exceeded`` …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Sampling:
    """How one sequence draws its tokens: every value explicit (the request's, else the
    model's defaults, else lmsp's), so a resumed task draws exactly what it drew before."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0  # LMSP extension (llama.cpp's): 1.0 is off
    top_logprobs: int = 0  # > 0: log probabilities of the chosen and this many top tokens


class Constraint(Protocol):
    """A per-sequence constraint on what may be generated next (a grammar compiled from a
    JSON Schema, a tool-call format …). The engine asks it for the allowed tokens before
    each sampling step and tells it which token was chosen; a constraint rebuilt from
    the same spec and fed a snapshot's tokens is in the same state again (resume)."""

    def allowed(self) -> npt.NDArray[np.bool_] | None:
        """A mask over the vocabulary (``True``: may come next), or ``None`` for any."""
        ...

    def advance(self, token: int) -> None:
        """The token that was chosen."""
        ...

    def finished(self) -> bool:
        """Nothing more may follow: the sequence ends here."""
        ...


@dataclass(frozen=True)
class Piece:
    """One generated token and the text it completes (``""`` inside a UTF-8 sequence)."""

    token: int
    text: str


class Tokenizer(Protocol):
    """Formats and tokenizes prompts without the weights: how ``POST /v1/responses``
    knows a prompt's length (and rejects one the context cannot hold) before queueing."""

    n_ctx: int

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def close(self) -> None: ...


class LoadedModel(Protocol):
    n_ctx: int

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The prompt of ``messages``; ``tools`` (function definitions) through the chat
        template when it renders them, else in the generic format of
        :mod:`lmsp.protocol.toolprompt`."""
        ...

    def generate(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
    ) -> Iterator[Piece]:
        """Tokens after ``prompt + resume``; with a ``constraint``, which is first fed
        ``resume``, only tokens it allows, ending when it is finished."""
        ...

    def close(self) -> None: ...


class Engine(Protocol):
    name: str

    def load(self, path: Path, n_ctx: int) -> LoadedModel: ...

    def tokenizer(self, path: Path, n_ctx: int) -> Tokenizer: ...


def sample(logits: npt.NDArray[np.float32], sampling: Sampling, position: int) -> int:
    """Pick a token: greedy at temperature 0, else temperature + top-p with an RNG
    keyed by ``(seed, position)`` — the same draw on every run, resumed or not."""
    if sampling.temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    if sampling.top_p < 1.0:
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, sampling.top_p) + 1)
        order = order[:keep]
    kept = probs[order]
    kept /= kept.sum()
    rng = np.random.default_rng([sampling.seed & 0xFFFFFFFF, position])
    return int(order[int(rng.choice(len(order), p=kept))])


class Utf8Stream:
    """Turns token byte pieces into text, holding back incomplete UTF-8 sequences."""

    def __init__(self, pending: bytes = b"") -> None:
        self.pending = pending

    def feed(self, data: bytes) -> str:
        buf = self.pending + data
        cut = len(buf)
        # find the start of a trailing incomplete sequence, if any
        for back in range(1, min(4, len(buf)) + 1):
            byte = buf[-back]
            if byte & 0xC0 == 0x80:  # continuation byte: keep looking
                continue
            need = (
                1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            )
            if need > back:
                cut = len(buf) - back
            break
        self.pending = buf[cut:]
        return buf[:cut].decode("utf-8", errors="replace")
