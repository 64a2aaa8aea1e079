"""A WebSocket's own ``store: false`` responses, so that a later turn on the same socket
continues one by ``previous_response_id`` (Open Responses, WebSocket mode).

A ``store: false`` response is deleted once it has finished, as over HTTP: nothing of it
outlives its turn on disk. What a next turn needs — the items the model saw and the
items it answered — is kept here instead, in memory, for this connection only: another
socket, or the same client over HTTP, finds nothing (``previous_response_not_found``),
and closing the socket (or a restart) drops it all. The cache holds at most
``max_bytes`` of items (their JSON size), the least recently used response evicted
first; a continuation that fails evicts the response it continued, as the specification
asks. Every miss says why (never seen, evicted for room, evicted after a failure).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError

Item = dict[str, Any]
#: the error code of a continuation that cannot be made (the specification's)
NOT_FOUND = "previous_response_not_found"


@dataclass(frozen=True)
class Entry:
    #: the items a continuation starts from: what the model saw, then its output
    items: list[Item]
    size: int


def given_items(value: Any) -> list[Item]:
    """A create body's ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def not_found(previous_id: str, why: str = "") -> LmspError:
    message = f"Previous response with id {previous_id!r} not found."
    if why:
        message += f" {why}"
    return LmspError(NOT_FOUND, message, param="previous_response_id")


class ConnectionCache:
    """The ``store: false`` responses of one socket, by id (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.size = 0
        # ids evicted, and why (a bounded memory of the reasons, for the error message)
        self.gone: OrderedDict[str, str] = OrderedDict()

    def __contains__(self, response_id: str) -> bool:
        return response_id in self.entries

    def context(self, previous_id: str) -> list[Item]:
        """The items a continuation of ``previous_id`` starts from, or
        ``previous_response_not_found`` saying why it is not here."""
        entry = self.entries.get(previous_id)
        if entry is None:
            raise not_found(previous_id, self.gone.get(previous_id, ""))
        self.entries.move_to_end(previous_id)
        return entry.items

    def add(self, response_id: str, seen: list[Item], output: list[Item]) -> None:
        """Keep a finished ``store: false`` response: ``seen`` (its context and input, as
        given) and its ``output`` items; older responses go when the cache is over its
        bound (one alone over it is not kept)."""
        items = [*seen, *output]
        size = len(json.dumps(items, separators=(",", ":")))
        if size > self.max_bytes:
            self._forget(
                response_id,
                f"Its items ({size} bytes) are more than a connection keeps"
                f" (LMSP_WS_CACHE_BYTES, {self.max_bytes} bytes); send the whole context.",
            )
            return
        self.entries[response_id] = Entry(items, size)
        self.size += size
        while self.size > self.max_bytes:
            oldest = next(iter(self.entries))
            self.evict(
                oldest,
                "It was evicted from this connection's cache for newer responses"
                f" (LMSP_WS_CACHE_BYTES, {self.max_bytes} bytes).",
            )

    def evict(self, response_id: str, why: str) -> None:
        """Drop ``response_id`` (a later continuation of it is told ``why``); an id
        this cache does not hold is left alone."""
        entry = self.entries.pop(response_id, None)
        if entry is not None:
            self.size -= entry.size
            self._forget(response_id, why)

    def _forget(self, response_id: str, why: str) -> None:
        self.gone[response_id] = why
        while len(self.gone) > 64:
            self.gone.popitem(last=False)
