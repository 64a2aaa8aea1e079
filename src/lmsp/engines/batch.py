"""Continuous batching: many sequences, one decode per step.

The engine's scheduling loop (:mod:`lmsp.engines.core`) runs the model over the next
tokens of every ready sequence as one batch per step. What goes into a step is decided
by a :class:`StepPolicy`, the one replaceable piece of the scheduler. :class:`FastSteps`
(the default) schedules as llama-server does: every generating sequence's token, and
prompts in full micro-batches beside them. :class:`ExactSteps` (``LMSP_EXACT=1``) is the
schedule whose results do not depend on what else is in the batch (a prompt chunk of at
most :data:`CHUNK` tokens alone, the generating sequences' single tokens together).

:class:`SequencePool` says which sequence of the context a new task takes: the free one
whose cached tokens share the longest prefix with the new prompt (prompt-prefix reuse),
else the least recently used. A finished task's tokens stay in its sequence until
another task needs the room, so the next turn of an agent loop evaluates only what is
new. Nothing here knows llama.cpp.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


#: tokens of one sequence in one step. llama.cpp's CPU kernels give bit-identical
#: results for a sequence fed 1 to 48 tokens a step, whatever else is in the batch, and
#: different ones from 64 on (measured; ``tests/engines/test_batched_real.py``). Keeping
#: every chunk at most this long is what makes a prompt evaluated in chunks, a resume
#: that re-evaluates a snapshot, a cached prefix and a batched step agree to the bit.
CHUNK = 32

#: the shortest cached prefix worth reusing: a chat template's first few tokens save
#: nothing, but a system prompt does (SmolLM2's default one is ~20 tokens, ~80 ms of
#: prompt on two cores), and an agent resending its short prompt saves all but one token
MIN_REUSE = CHUNK // 2

Logits: TypeAlias = "npt.NDArray[np.float32]"


@dataclass
class Request:
    """One sequence's tokens for the next step."""

    seq: int
    tokens: list[int]
    pos: int  # the position of tokens[0]
    logits: bool  # the last token's logits are wanted
    result: Logits | None = None


class StepPolicy(Protocol):
    """What goes into the next step: the one replaceable piece of the scheduler."""

    def form(self, todo: Sequence[int], budget: int) -> list[tuple[int, int]]:
        """``todo``: how many tokens each ready sequence has left to evaluate, oldest
        turn first (a prompt's rest, or the one token just drawn); ``budget``: the most
        tokens a step holds. The step, as ``(index into todo, tokens to take)``."""
        ...


class FastSteps:
    """The default schedule, as llama-server forms its batches: the single token of every
    generating sequence, then as much prompt (oldest turn first) as the step has room
    for, so a long prompt is evaluated in full micro-batches while the others go on
    generating in the same ``llama_decode``. A sequence's bits may then depend on what
    shared its steps (docs/performance.md): fast, not bit-reproducible."""

    def form(self, todo: Sequence[int], budget: int) -> list[tuple[int, int]]:
        budget = max(1, budget)
        step = [(i, 1) for i, n in enumerate(todo) if n == 1][:budget]
        room = budget - len(step)
        for i, n in enumerate(todo):
            if room <= 0:
                break
            if n > 1:
                take = min(n, room)
                step.append((i, take))
                room -= take
        return step


class ExactSteps:
    """The schedule that keeps every sequence's arithmetic independent of the others: a
    prompt chunk (at most :data:`CHUNK` tokens) runs in a step of its own, and the single
    tokens of every generating sequence run together. Turns alternate, so a long prompt
    never stalls the sequences generating. (Mixing a chunk with other sequences' tokens
    changed the later tokens of a sequence in about half of the runs of a test,
    ``test_two_sequences_sharing_a_prefix_at_once_stay_exact``.)"""

    def form(self, todo: Sequence[int], budget: int) -> list[tuple[int, int]]:
        if not todo:
            return []
        if todo[0] > 1:
            return [(0, min(CHUNK, todo[0], budget))]
        singles = [i for i, n in enumerate(todo) if n == 1]
        return [(i, 1) for i in singles[: max(1, budget)]]


@dataclass
class Slot:
    """One sequence of the context and the tokens its cache holds (positions 0…n-1)."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    used: float = 0.0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    import numpy as np

    n = min(len(a), len(b))
    if n == 0:
        return 0
    left = np.asarray(a[:n], dtype=np.int64)
    right = np.asarray(b[:n], dtype=np.int64)
    differ = np.flatnonzero(left != right)
    return int(differ[0]) if len(differ) else n


@dataclass(frozen=True)
class Choice:
    """Where a new sequence starts: its slot, and how many of its prompt's tokens the
    slot already holds."""

    slot: Slot
    cached: int


class SequencePool:
    """Which sequence a new task takes. Eviction: a free sequence keeps its tokens until
    a task takes it; a task takes the free sequence sharing the longest prefix with its
    prompt, and among those sharing none the least recently used."""

    def __init__(self, sequences: int) -> None:
        self.slots = [Slot(seq) for seq in range(sequences)]
        self._lock = threading.Lock()

    def take(self, tokens: Sequence[int]) -> Choice:
        with self._lock:
            free = [slot for slot in self.slots if not slot.busy]
            if not free:
                raise RuntimeError("more sequences than the context holds")
            scored = [(common_prefix(slot.tokens, tokens), slot) for slot in free]
            best, slot = max(scored, key=lambda pair: (pair[0], -pair[1].used))
            if best < MIN_REUSE:
                best = 0
            if best == 0:
                slot = min(free, key=lambda s: s.used)
            slot.busy = True
            slot.used = time.monotonic()
            slot.tokens = []  # in flux until its task says what it holds (hold)
            return Choice(slot, best)

    def hold(self, slot: Slot, tokens: list[int]) -> None:
        """``tokens`` is the list of what the busy ``slot`` holds, kept up to date by
        its task as it goes."""
        with self._lock:
            slot.tokens = tokens

    def give_back(self, slot: Slot, tokens: list[int]) -> None:
        """A task is done with its sequence, whose cache now holds ``tokens``."""
        with self._lock:
            slot.tokens = tokens
            slot.busy = False
            slot.used = time.monotonic()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"seq": s.seq, "tokens": len(s.tokens), "busy": s.busy} for s in self.slots]
