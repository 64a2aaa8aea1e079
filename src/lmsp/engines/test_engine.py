"""A deterministic fast engine for tests. Never the default model.

It "reads" the prompt and writes words chosen by ``(seed, position)``, one token a
word, after an optional delay per token (``LMSP_TEST_ENGINE_DELAY`` seconds). A
prompt containing ``[engine-error]`` fails after the first tokens, for tests of the
failure path.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmsp.engines.base import Constraint, EngineError, Generation, LoadOptions, Piece, Sampling
from lmsp.protocol import completions, toolprompt

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "olá",
    "ñandú",
    "雪",
    "🙂",
]
EOS = len(WORDS)
DEFAULT_LENGTH = 24
TEST_MODEL_ID = "lmsp-test"
TEST_MODEL_BYTES = b"lmsp deterministic test engine v1\n"


class TestModel:
    n_ctx = 4096

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        raw = completions.raw_prompt(messages)
        if raw is not None:  # a text completion's prompt: as given
            return list(raw.encode())
        messages = toolprompt.with_tools(messages, tools or [])
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return list(text.encode())

    def generate(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
    ) -> Generation:
        return Generation(self._pieces(prompt, resume, sampling, constraint))

    def _pieces(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None,
    ) -> Iterator[Piece]:
        if constraint is not None:
            raise EngineError("engine_error", "The test engine cannot constrain its output.")
        text = bytes(prompt).decode(errors="replace")
        if "[context-overflow]" in text:
            raise EngineError("context_length_exceeded", "The prompt does not fit the context.")
        key = hashlib.sha256(bytes(prompt)).digest()
        length = DEFAULT_LENGTH
        for position in range(len(resume), length + 1):
            if "[engine-error]" in text and position >= 3:
                raise EngineError("engine_error", "The test engine failed on request.")
            if self.delay:
                time.sleep(self.delay)
            if position == length:
                return
            salt = sampling.seed if sampling.temperature > 0 else 0
            digest = hashlib.sha256(key + f"{salt}:{position}".encode()).digest()
            token = digest[0] % len(WORDS)
            yield Piece(token, WORDS[token] + " ", _logprobs(token, sampling))

    def close(self) -> None:
        return None


def _logprobs(token: int, sampling: Sampling) -> dict[str, Any] | None:
    """The test engine draws every word alike: each has probability 1/len(WORDS)."""
    if not sampling.logprobs:
        return None
    logprob = -math.log(len(WORDS))

    def entry(tok: int) -> dict[str, Any]:
        text = WORDS[tok] + " "
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    top = [entry(tok) for tok in range(min(sampling.top_logprobs, len(WORDS)))]
    return {**entry(token), "top_logprobs": top}


class TestEngine:
    name = "test"

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> TestModel:
        if path.read_bytes() != TEST_MODEL_BYTES:
            raise EngineError("model_load_failed", "Not a test-engine model file.")
        return TestModel(float(os.environ.get("LMSP_TEST_ENGINE_DELAY", "0.002")))

    def tokenizer(self, path: Path, n_ctx: int) -> TestModel:
        return TestModel(0.0)
