"""The engine interface.

An engine loads a model file in an engine process of its own (:mod:`lmsp.engines.
worker`, driven by :mod:`lmsp.engines.core`); the API process sees it as a
:class:`LoadedModel` (:class:`lmsp.engines.client.EngineClient`), which turns messages
into prompt tokens (with a tokenizer that loads no weights) and yields generated tokens
one at a time. ``generate`` takes the tokens already produced (from a snapshot) and
continues after them, so a resumed task picks up exactly where its last persisted event
left off. Sampling is keyed by ``(seed, position)``, never by hidden RNG state, so a
resumed run draws the same tokens an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class EngineError(Exception):
    """A failure with a protocol error code (``engine_error``, ``context_length_exceeded`` …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class EngineCrashed(EngineError):
    """The engine process died (a segfault, ``kill -9``, out of memory) while it held
    the sequence: the task follows its ``on_restart`` policy, as after a restart."""

    def __init__(self, message: str) -> None:
        super().__init__("engine_crashed", message)


#: the default ``service_tier``'s place in the claim order (lmsp.store.tasks.TIERS)
DEFAULT_TIER = 1


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
    top_logprobs: int = 0  # how many of the most likely tokens each logprobs entry lists
    logprobs: bool = False  # report each chosen token's log probability (and the top ones)
    #: the task's ``service_tier`` in lmsp's claim order (2 priority, 1 default, 0 flex):
    #: lmsp's own engines order by the claim alone; a remote upstream with a scheduling
    #: priority is given it (docs/remote-engines.md)
    tier: int = DEFAULT_TIER


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


class Piece(msgspec.Struct, frozen=True, array_like=True):
    """One generated token and the text it completes (``""`` inside a UTF-8 sequence).
    A :mod:`msgspec` struct: an engine step's pieces cross to the API process packed
    (:class:`~lmsp.engines.protocol.Step`) and are read back as these, in C."""

    token: int
    text: str
    #: with ``Sampling.logprobs``: ``{"token", "logprob", "bytes", "top_logprobs"}``
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class PromptProgress:
    """How far the engine has read a generation's prompt: ``read`` of ``total`` tokens
    (a resume's tokens included), ``cached`` of them from a cache rather than evaluated,
    in ``seconds`` since its reading began."""

    read: int
    total: int
    cached: int
    seconds: float

    def rate(self) -> float | None:
        """Tokens evaluated a second (``None`` before any time has passed)."""
        return (self.read - self.cached) / self.seconds if self.seconds > 0 else None


class Generation(Iterator[Piece]):
    """The pieces of one generation, and how many of its prompt's tokens came from a
    cache instead of being evaluated (known once the first piece is asked for).
    ``close`` gives its sequence back; the runner closes every generation it starts.
    ``cancel`` asks the engine to stop it (the iteration then ends), ``interrupt`` ends
    the iteration at once (the service is shutting down)."""

    def __init__(self, pieces: Iterator[Piece] | None = None) -> None:
        self.cached_tokens = 0
        self._pieces: Iterator[Piece] = iter(()) if pieces is None else pieces

    def __next__(self) -> Piece:
        return next(self._pieces)

    def watch(self, callback: Callable[[PromptProgress], None]) -> None:
        """Have ``callback`` told how far a long prompt is read, as the engine says
        (from another thread); a generation that says nothing never calls it."""
        return None

    def pace(self, until: float) -> None:
        """The consumer needs no piece before ``until`` (:func:`time.monotonic`) unless
        the generation ends: a generation fed from another thread may keep its pieces
        until then instead of waking the consumer for each (the next ``next`` then
        waits for that time, or for the end). A time past is "at once"."""
        return None

    def ready(self) -> int:
        """How many pieces the next ``next`` calls return without waiting."""
        return 0

    def cancel(self) -> None:
        return None

    def interrupt(self) -> None:
        return None

    def close(self) -> None:
        return None


class Tokenizer(Protocol):
    """Formats and tokenizes prompts without the weights: how ``POST /v1/responses``
    knows a prompt's length (and rejects one the context cannot hold) before queueing."""

    n_ctx: int
    n_embd: int  # the length of the model's embeddings
    n_vocab: int

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def text_tokens(self, text: str) -> list[int]:
        """``text`` as an embedding input (no chat template)."""
        ...

    def close(self) -> None: ...


class LoadedModel(Protocol):
    """A model loaded in an engine, as the API process uses it."""

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
        grammar: str | None = None,
        max_tokens: int | None = None,
    ) -> Generation:
        """At most ``max_tokens`` tokens after ``prompt + resume``; with a ``grammar``
        (llguidance's, first fed ``resume``), only tokens it allows, ending when it is
        finished."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LoadOptions:
    sequences: int = 1  # decoded together in one context (``LMSP_PARALLEL``)
    digest: str = ""  # the blob's, which keys its saved prefixes
    prefix_files: Any = None  # a :class:`lmsp.engines.kvfiles.PrefixFiles`, or None
    embed_tokens: int = 512  # the embedding context's size: the longest input it embeds
    exact: bool = False  # ``LMSP_EXACT``: batched = solo, resumed = uninterrupted, to the bit
    kv_budget: int = 0  # bytes every sequence's KV cache may take together (0: no bound)
    embed_share: float = 1 / 4  # ``LMSP_EMBED_SHARE``: embeddings' time while generating
    # ``LMSP_ROPE_SCALING``: a context past the model's trained one is stretched with YaRN
    rope_scaling: bool = True
    #: ``LMSP_ENGINE_NICE``: added to the engine process's niceness (a local model's)
    nice: int = 0
    #: a remote model's upstream (its record's ``remote``: :mod:`lmsp.engines.remote`)
    remote: dict[str, Any] | None = None


def context_size(
    requested: int, trained: int, streams: int, kv_bytes_per_token: int, budget: int
) -> int:
    """One sequence's context: ``requested`` (``LMSP_N_CTX``; 0: the model's ``trained``
    context), cut so that ``streams`` KV streams of it fit in ``budget`` bytes, in whole
    256-token pages (llama.cpp pads to them) and never below one page."""
    size = requested if requested > 0 else trained
    if budget > 0 and kv_bytes_per_token > 0:
        size = min(size, budget // (kv_bytes_per_token * max(1, streams)))
    return max(256, size // 256 * 256)


@runtime_checkable
class Serving(Protocol):
    """A loaded model that serves the engine's channel itself instead of being stepped
    by :class:`lmsp.engines.core.EngineCore` (a remote upstream's:
    :mod:`lmsp.engines.remote`)."""

    n_ctx: int
    sequences: int

    def serve(self, channel: Any, alive: Callable[[], bool]) -> None: ...

    def memory_bytes(self) -> int: ...

    def close(self) -> None: ...


def penalized(
    logits: npt.NDArray[np.float32], sampling: Sampling, generated: Sequence[int]
) -> npt.NDArray[np.float64]:
    """The logits after the penalties on the tokens generated so far (all of them, the
    snapshot's included): ``repeat_penalty`` (llama.cpp's: a positive logit divided, a
    negative one multiplied), then ``frequency_penalty`` times each token's count and
    ``presence_penalty`` once per token present (OpenAI's)."""
    import numpy as np

    out = logits.astype(np.float64)
    if not generated or (
        sampling.repeat_penalty == 1.0
        and sampling.frequency_penalty == 0.0
        and sampling.presence_penalty == 0.0
    ):
        return out
    tokens, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
    inside = tokens < len(out)
    tokens, counts = tokens[inside], counts[inside]
    values = out[tokens]
    if sampling.repeat_penalty != 1.0:
        values = np.where(
            values > 0, values / sampling.repeat_penalty, values * sampling.repeat_penalty
        )
    values = values - counts * sampling.frequency_penalty - sampling.presence_penalty
    out[tokens] = values
    return out


def _top(probs: npt.NDArray[np.float64], m: int) -> npt.NDArray[np.intp]:
    """The ``m`` most likely tokens, most likely first (ties by token id): what a
    stable sort of the whole vocabulary would give, at the cost of a partition."""
    import numpy as np

    n = len(probs)
    if m >= n:
        return np.argsort(-probs, kind="stable")
    kth = np.partition(probs, n - m)[n - m]  # the m-th largest value
    above = np.flatnonzero(probs > kth)
    equal = np.flatnonzero(probs == kth)[: m - len(above)]
    chosen = np.concatenate([above, equal])
    ordered: npt.NDArray[np.intp] = chosen[np.argsort(-probs[chosen], kind="stable")]
    return ordered


def sample(
    logits: npt.NDArray[np.float32],
    sampling: Sampling,
    position: int,
    generated: Sequence[int] = (),
) -> int:
    """Pick a token: penalties over ``generated`` first; then greedy at temperature 0,
    else temperature, ``top_k``, ``top_p`` and ``min_p`` with an RNG keyed by
    ``(seed, position)`` — the same draw on every run, resumed or not.

    Only as much of the vocabulary is sorted as the cuts need (the ``top_k`` best, or
    the best until ``top_p`` of the mass), so a step costs well under a millisecond."""
    import numpy as np

    scores = penalized(logits, sampling, generated)
    if sampling.temperature <= 0:
        return int(np.argmax(scores))
    scaled = scores / sampling.temperature
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()
    n = len(probs)
    k = sampling.top_k if 0 < sampling.top_k < n else n
    candidates: npt.NDArray[np.intp] | None = _top(probs, k) if k < n else None
    if sampling.top_p < 1.0:
        if candidates is None:  # widen the sorted head until it holds top_p of the mass
            size = 256
            while True:
                candidates = _top(probs, min(size, n))
                if size >= n or probs[candidates].sum() >= sampling.top_p:
                    break
                size *= 4
            total = 1.0
        else:
            total = float(probs[candidates].sum())
        cumulative = np.cumsum(probs[candidates]) / total
        keep = int(np.searchsorted(cumulative, sampling.top_p) + 1)
        candidates = candidates[:keep]
    if candidates is None:
        candidates = np.arange(n)
    if sampling.min_p > 0.0:
        floor = sampling.min_p * probs.max()
        candidates = candidates[probs[candidates] >= floor]
    cdf = np.cumsum(probs[candidates])
    rng = np.random.default_rng([sampling.seed & 0xFFFFFFFF, position])
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(candidates[min(index, len(candidates) - 1)])


def top_logprobs(
    logits: npt.NDArray[np.float32], token: int, count: int
) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log probability under the model's distribution (the logits as
    the model gave them, a constraint's mask applied) and the ``count`` most likely
    tokens with theirs."""
    import numpy as np

    scores = logits.astype(np.float64)
    finite = np.isfinite(scores)
    top = scores[finite].max()
    logz = top + np.log(np.exp(scores[finite] - top).sum())
    logp = scores - logz
    best = np.argsort(-logp, kind="stable")[:count] if count > 0 else np.array([], np.int64)
    return float(logp[token]), [(int(t), float(logp[t])) for t in best if finite[t]]


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
