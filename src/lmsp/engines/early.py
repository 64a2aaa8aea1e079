"""Generations begun before their task is committed, kept for the attempt that asks for
exactly them.

A create's first turn is started by the idle worker whose claim rides in the create's
own commit, while the writer commits (:mod:`lmsp.runner.early`): the engine — a remote
upstream above all, a request's round trip away — starts a commit's time sooner. The
attempt that later asks its engine for the very same inputs (prompt and resume ids,
sampling, grammar, budget) is given that generation (:meth:`Early.adopt`) instead of a
new one: the tokens it would have started itself, nothing written before its task is
committed. One not adopted is cancelled by whoever began it (:meth:`Early.drop`); a
wrong guess costs the engine's work, never a token of another task.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from lmsp.engines.base import Generation, Sampling

G = TypeVar("G", bound=Generation)


@dataclass(frozen=True)
class Inputs:
    """What a generation is asked for: two asks with equal inputs get the same tokens."""

    prompt: tuple[int, ...]
    resume: tuple[int, ...]
    sampling: Sampling
    grammar: str | None
    max_tokens: int | None


class Early(Generic[G]):
    """One engine's generations begun early, by their inputs (one each at most)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Inputs, G] = {}

    def __bool__(self) -> bool:
        return bool(self._held)  # a look without the lock: a miss only costs a new start

    def hold(self, inputs: Inputs, generation: G) -> bool:
        """Keep ``generation`` for an attempt asking for ``inputs``; ``False`` when one
        with equal inputs is kept already (the caller closes its own)."""
        with self._lock:
            return self._held.setdefault(inputs, generation) is generation

    def adopt(self, inputs: Inputs) -> G | None:
        """The generation begun for ``inputs``, now the asker's, or ``None``."""
        with self._lock:
            return self._held.pop(inputs, None)

    def drop(self, inputs: Inputs, generation: G) -> bool:
        """``generation`` is not wanted any more: closed (its sequence cancelled in the
        engine) unless an attempt adopted it. Whether it was closed."""
        with self._lock:
            if self._held.get(inputs) is not generation:
                return False  # adopted: the attempt's to close
            del self._held[inputs]
        generation.close()
        return True
