"""A client that leaves before its answer, as the use cases see it: the transport that
carries a request watches its connection (HTTP: :mod:`lmsp.api.leaving`) and hands the
use case a :class:`Watch`, which raises :class:`ClientGone` when the client goes first.
The work the answer was for then stops: a task is cancelled, an embeddings request is
dropped by its engine."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Watch(Protocol):
    """What ``waiting`` gives, or :class:`ClientGone` (``waiting`` cancelled) when the
    client disconnects first."""

    def __call__(self, waiting: Awaitable[T], /) -> Awaitable[T]: ...
