"""The engine protocol: every message between the API process and an engine process.

This module is the one seam between the two (as vLLM's ``EngineCore`` sits behind one
IPC seam): the API process sends :class:`Submit`, :class:`Cancel`, :class:`Embed`,
:class:`Stats` and :class:`Shutdown`; the engine answers :class:`Ready` once its model is
loaded, then :class:`Tokens`, :class:`Done` or :class:`Error` for each sequence (and
:class:`Progress` while a long prompt is read),
:class:`Embeddings` (or :class:`Error`) for each embedding request, and
:class:`StatsReply`. Nothing else crosses.

The transport is a :mod:`multiprocessing` connection (a pipe whose ends pickle what is
sent): an engine process gets one end when it is spawned, and an engine run in a thread
(fast tests) gets one end of an in-process pipe: the same protocol either way. Each
``send`` carries a *frame*, a list of messages: the engine sends one frame per step
with every sequence's new tokens, so a step costs one write however many sequences it
advanced. Those tokens travel packed (:func:`pack`): one :class:`Step` at the head of
the frame, the :class:`Tokens` of every sequence encoded once with :mod:`msgspec`
(MessagePack, structs as arrays) instead of pickled object by object, and decoded once,
in C, by the API process's reader thread (:meth:`Step.tokens`); :func:`unpack` gives a
frame's messages back as they were sent.

Sequence ids are chosen by the API side and unique per engine; the engine knows
nothing of tasks. Sampling is part of :class:`Submit` and the engine draws every token
by ``(seed, position)``, so a resubmitted sequence (a resume) draws what it drew before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from lmsp.engines.base import Piece, Sampling

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: why a sequence ended (:class:`Done`)
STOP = "stop"  # an end-of-generation token, or its grammar allows nothing more
LENGTH = "length"  # ``max_tokens`` generated, or the context is full
CANCELLED = "cancelled"  # the API side cancelled it


# -- API process → engine ------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Generate after ``prompt + resume``: at most ``max_tokens`` tokens (``None``: until
    the context is full), held to ``grammar`` (llguidance's, compiled in the engine;
    first fed ``resume``) when one is given."""

    id: int
    prompt: list[int]
    resume: list[int]
    sampling: Sampling
    grammar: str | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class Cancel:
    """Stop generating ``id`` and free its sequence, or drop the embedding request
    ``id``; answered with ``Done(id, "cancelled")`` unless it had ended already."""

    id: int


@dataclass(frozen=True)
class Embed:
    """One vector per input (each a list of tokens, as the model's tokenizer gave them),
    pooled as the model says and L2-normalised; answered with :class:`Embeddings`, or
    :class:`Error` (``model_cannot_embed`` …) for the whole request. Computed in an
    embedding context of its own, apart from the sequences being generated."""

    id: int
    inputs: list[list[int]]


@dataclass(frozen=True)
class Stats:
    """Ask for the engine's figures (steps, tokens, sequences, prefix cache)."""

    id: int


@dataclass(frozen=True)
class Shutdown:
    """Drop every sequence, finish writing saved prefixes, free the model and exit."""


# -- engine → API process ------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """The model is loaded: what the API side needs to know of it."""

    pid: int
    n_ctx: int  # one sequence's context
    sequences: int  # generated together
    memory_bytes: int  # weights plus every sequence's KV cache (0: unknown)


class Tokens(msgspec.Struct, frozen=True, array_like=True):
    """New pieces of a sequence; the first message of a sequence carries how many of its
    prompt's tokens came from a cache (``cached_tokens``), even with no piece. Sent
    packed in a :class:`Step` (see :func:`pack`)."""

    id: int
    pieces: list[Piece]
    cached_tokens: int | None = None


_step_encoder = msgspec.msgpack.Encoder()
_step_decoder = msgspec.msgpack.Decoder(list[Tokens])


@dataclass(frozen=True)
class Step:
    """The :class:`Tokens` of one frame, every sequence's, as one MessagePack array
    (``[[id, [[token, text, logprobs], …], cached_tokens], …]``): one object to pickle
    and one C call to read, however many sequences and pieces it holds."""

    data: bytes

    @classmethod
    def of(cls, tokens: list[Tokens]) -> Step:
        return cls(_step_encoder.encode(tokens))

    def tokens(self) -> list[Tokens]:
        return _step_decoder.decode(self.data)


@dataclass(frozen=True)
class Progress:
    """How far a sequence's prompt (with a resume's tokens) is read: ``read`` of
    ``total`` tokens, ``cached`` of them from a cache rather than evaluated, ``seconds``
    since its reading began. Sent while a prompt takes more than one step, at most every
    :data:`PROGRESS_INTERVAL` a sequence: never a message a token."""

    id: int
    read: int
    total: int
    cached: int
    seconds: float


#: the least time between two :class:`Progress` messages of one sequence
PROGRESS_INTERVAL = 0.5


@dataclass(frozen=True)
class Done:
    """The sequence ended (``reason``: :data:`STOP`, :data:`LENGTH`, :data:`CANCELLED`)."""

    id: int
    reason: str


@dataclass(frozen=True)
class Error:
    """The sequence failed with a protocol error code (``engine_error``,
    ``context_length_exceeded`` …); ``id`` ``None``: the model could not be loaded."""

    id: int | None
    code: str
    message: str


@dataclass(frozen=True)
class Embeddings:
    """The vectors of an :class:`Embed`: one float32 row per input, in order;
    ``yielded``: how many turns it gave way to generating sequences."""

    id: int
    vectors: npt.NDArray[np.float32]
    yielded: int = 0


@dataclass(frozen=True)
class StatsReply:
    id: int
    figures: dict[str, Any] = field(default_factory=dict)


ToEngine = Submit | Cancel | Embed | Stats | Shutdown
FromEngine = Ready | Tokens | Progress | Done | Error | Embeddings | StatsReply


def pack(messages: list[FromEngine]) -> list[Any]:
    """The frame that carries ``messages``: their :class:`Tokens` in one :class:`Step`
    at its head, then the others in order. A sequence's tokens still come before its
    end: no message in a frame speaks of a sequence before its tokens there do (a
    cancelled or failed sequence produces nothing more)."""
    tokens = [m for m in messages if isinstance(m, Tokens)]
    if not tokens:
        return list(messages)
    return [Step.of(tokens), *(m for m in messages if not isinstance(m, Tokens))]


def unpack(frame: list[Any]) -> list[FromEngine]:
    """A frame's messages, its :class:`Step` read back into :class:`Tokens`."""
    out: list[FromEngine] = []
    for message in frame:
        if isinstance(message, Step):
            out.extend(message.tokens())
        else:
            out.append(message)
    return out


class Channel(Protocol):
    """One end of the transport (a :class:`multiprocessing.connection.Connection`)."""

    def send(self, obj: Any) -> None: ...

    def recv(self) -> Any: ...

    def poll(self, timeout: float | None = 0.0) -> bool: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...
