"""How the engine shares its one thread between generation steps and embedding batches.

The engine core (:mod:`lmsp.engines.core`) runs generation steps and embedding batches
on one thread, so whatever time one takes the other waits. Taking turns one for one is
not fair: a generation step of a single token costs a few milliseconds, an embedding
batch of 512 tokens a hundred times that, so a sequence generating beside a large
embedding request went ~100 times slower (the red team's 24-token answer: 6.7 s → 63 s).

:class:`EmbedShare` shares by *time*: while any sequence is generating (or waiting to
start), embedding batches may take at most :attr:`share` of the engine's time. After a
batch of ``e`` seconds, the next one waits until the sequences have had
``e * (1 - share) / share`` seconds of steps. With the default share of a quarter, a
generating sequence keeps at least three quarters of the rate it has alone (a factor
of 1.33), apart from the one batch that may be running when it arrives: a batch is small,
:data:`~lmsp.engines.core.EMBED_CHUNK` tokens (a model pooled by its last token is
embedded a chunk at a time; other models one input at most). When no sequence
generates, embeddings take the whole engine; an embedding request never starves either
(each turn of its share it gets one batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: the part of the engine's time embedding batches may take while sequences generate
DEFAULT_SHARE = 1 / 4


class EmbedShare:
    """The time accounting of the module docstring. ``clock`` is for tests."""

    def __init__(
        self, share: float = DEFAULT_SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.share = min(1.0, max(0.01, share))
        self.clock = clock
        self.owed = 0.0  # seconds of generation steps owed before the next batch
        self.yielded = 0  # turns an embedding batch gave way to generation

    def may_embed(self, generating: bool) -> bool:
        """Whether an embedding batch may run this turn."""
        if not generating:
            self.owed = 0.0  # nothing to be fair to: the debt is forgiven (this batch's
            return True  # is owed to whoever comes next)
        if self.owed <= 1e-6:  # paid (to a rounding error)
            return True
        self.yielded += 1
        return False

    def stepped(self, seconds: float) -> None:
        """A generation step took ``seconds``."""
        self.owed = max(0.0, self.owed - seconds)

    def embedded(self, seconds: float, generating: bool) -> None:
        """An embedding batch took ``seconds`` (``generating``: while sequences did; a
        batch run while none did is owed too, to a sequence that arrived meanwhile)."""
        self.owed += seconds * (1.0 - self.share) / self.share
