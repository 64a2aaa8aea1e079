"""A deterministic fast engine for tests. Never the default model.

It runs in an engine process like the real one (the same core, protocol and
supervision). It "reads" the prompt and writes words chosen by ``(seed, position)``, one
token a word, after an optional delay per step (``LMSP_TEST_ENGINE_DELAY`` seconds), up
to ``LMSP_TEST_ENGINE_LENGTH`` words an answer (24 unless set: long streams for the
scale benchmarks).
Fault seams, after the first three words: a prompt containing ``[engine-error]`` fails
its sequence (``engine_error``), one containing ``[engine-crash]`` kills its engine
process (``SIGKILL``, as a segfault would), and ``[context-overflow]`` is refused as too
long for the context.

Its embeddings are deterministic too: each token stands for a fixed random vector (keyed
by the token), an input's embedding is the L2-normalised mean of its tokens' vectors,
and one call embeds at most :data:`EMBED_BATCH` inputs, so a large request takes several
turns of the engine's loop, as with llama.cpp.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsp.engines.base import EngineError, LoadOptions, Piece, Sampling
from lmsp.engines.batch import Logits, Request
from lmsp.engines.core import Seq
from lmsp.engines.worker import die
from lmsp.protocol import completions, toolprompt

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

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
N_CTX = 4096
TEST_MODEL_ID = "lmsp-test"
TEST_MODEL_BYTES = b"lmsp deterministic test engine v1\n"
EMBED_DIM = 64
EMBED_BATCH = 8


class DeterministicModel:
    """The test engine's tokenizer (the API side): a prompt's tokens are its bytes."""

    n_ctx = N_CTX
    n_embd = EMBED_DIM
    n_vocab = 256  # a token is a byte

    def text_tokens(self, text: str) -> list[int]:
        return list(text.encode())

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        raw = completions.raw_prompt(messages)
        if raw is not None:  # a text completion's prompt: as given
            return list(raw.encode())
        messages = toolprompt.with_tools(messages, tools or [])
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        # a turn of no message (input only of tool lists, say) still opens the answer,
        # as a chat template's generation prompt does: never an empty prompt
        return list((text or "assistant:").encode())

    def close(self) -> None:
        return None


def answer_length() -> int:
    """Words an answer runs to: ``LMSP_TEST_ENGINE_LENGTH`` (at least 1), 24 unless set."""
    raw = os.environ.get("LMSP_TEST_ENGINE_LENGTH", "")
    return max(1, int(raw)) if raw.strip() else DEFAULT_LENGTH


def word(
    prompt: list[int], sampling: Sampling, position: int, length: int = DEFAULT_LENGTH
) -> Piece | None:
    """The piece at ``position`` (``None``: the end, after ``length`` words) — a pure
    function of the prompt, the seed (when sampling) and the position."""
    if position >= length:
        return None
    key = hashlib.sha256(bytes(prompt)).digest()
    salt = sampling.seed if sampling.temperature > 0 else 0
    digest = hashlib.sha256(key + f"{salt}:{position}".encode()).digest()
    token = digest[0] % len(WORDS)
    return Piece(token, WORDS[token] + " ", _logprobs(token, sampling))


def embedding(tokens: list[int]) -> npt.NDArray[np.float32]:
    """An input's embedding: the normalised mean of its tokens' fixed vectors."""
    import numpy as np

    total = np.zeros(EMBED_DIM, dtype=np.float64)
    for token in tokens:
        total += _token_vector(token)
    norm = float(np.sqrt(np.sum(total**2)))
    return (total / norm if norm > 0 else total).astype(np.float32)


_vectors: dict[int, npt.NDArray[np.float64]] = {}


def _token_vector(token: int) -> npt.NDArray[np.float64]:
    import numpy as np

    vector = _vectors.get(token)
    if vector is None:
        vector = _vectors[token] = np.random.default_rng([7, token]).standard_normal(EMBED_DIM)
    return vector


def reference(prompt: list[int], sampling: Sampling, length: int | None = None) -> list[Piece]:
    """What an uninterrupted run of ``prompt`` writes (for tests)."""
    length = answer_length() if length is None else length
    pieces: list[Piece] = []
    while (piece := word(prompt, sampling, len(pieces), length)) is not None:
        pieces.append(piece)
    return pieces


class DeterministicBackend:
    """The test engine in its engine process: one step sleeps ``delay`` seconds and
    advances every sequence by one word; a prompt is "evaluated" in one step."""

    n_ctx = N_CTX
    max_step_tokens = 512

    def __init__(self, delay: float, sequences: int, length: int = DEFAULT_LENGTH) -> None:
        self.delay = delay
        self.length = length
        self.sequences = max(1, sequences)
        self._free = list(range(self.sequences))
        self.closed = False
        _no_logits()  # numpy imported as the engine loads, not at its first step

    def memory_bytes(self) -> int:
        return 0

    def open(self, seq: Seq) -> None:
        if seq.grammar is not None:
            raise EngineError("engine_error", "The test engine cannot constrain its output.")
        if "[context-overflow]" in _text(seq.prompt):
            raise EngineError("context_length_exceeded", "The prompt does not fit the context.")
        seq.slot = self._free.pop()
        seq.held = seq.context[:-1]  # nothing to compute: all but the last token "cached"
        seq.state = seq.slot

    def decode(self, step: list[Request]) -> None:
        if self.delay:
            time.sleep(self.delay)
        for request in step:
            if request.logits:
                request.result = _no_logits()

    def evaluated(self, seq: Seq) -> None:
        return None

    def pick(self, seq: Seq, logits: Logits) -> Piece | None:
        position = len(seq.resume) + seq.produced
        text = _text(seq.prompt)
        if position >= 3 and position < self.length:
            if "[engine-error]" in text:
                raise EngineError("engine_error", "The test engine failed on request.")
            if "[engine-crash]" in text:
                die()  # as a segfault would: the engine process is gone
        return word(seq.prompt, seq.sampling, position, self.length)

    def release(self, seq: Seq, intact: bool) -> None:
        if seq.state is not None:
            self._free.append(seq.state)
            seq.state = None

    def sent(self, seqs: list[Seq]) -> None:
        return None

    def embed(
        self, inputs: list[list[int]], max_tokens: int | None = None
    ) -> npt.NDArray[np.float32]:
        import numpy as np

        if self.delay:
            time.sleep(self.delay)
        return np.stack([embedding(tokens) for tokens in inputs[:EMBED_BATCH]])

    def figures(self) -> dict[str, Any]:
        return {"sequences": self.sequences - len(self._free)}

    def close(self) -> None:
        self.closed = True


def _text(prompt: list[int]) -> str:
    return bytes(prompt).decode(errors="replace")


@functools.cache
def _no_logits() -> Logits:
    """The empty logits of a step (numpy imported in the engine process only)."""
    import numpy as np

    return np.zeros(0, dtype=np.float32)


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


class DeterministicEngine:
    name = "test"
    constrains = False  # no grammar: tools and schemas are refused before any write

    def load(
        self, path: Path, n_ctx: int, options: LoadOptions | None = None
    ) -> DeterministicBackend:
        if path.read_bytes() != TEST_MODEL_BYTES:
            raise EngineError("model_load_failed", "Not a test-engine model file.")
        delay = float(os.environ.get("LMSP_TEST_ENGINE_DELAY", "0.002"))
        sequences = (options or LoadOptions()).sequences
        return DeterministicBackend(delay, sequences, answer_length())

    def tokenizer(
        self, path: Path, n_ctx: int, options: LoadOptions | None = None
    ) -> DeterministicModel:
        return DeterministicModel()

    def context_length(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> int:
        return N_CTX
