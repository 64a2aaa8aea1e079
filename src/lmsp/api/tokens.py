"""Tokens checked without a database round trip per request.

:class:`TokenCache` keeps the clients that recent tokens authenticated, keyed by the
token's SHA-256 (never the token), each with the version of the ``clients`` table it was
read under (:class:`lmsp.store.db.Versions`). Any change to a client row (a revoke, a
new client, changed scopes) bumps that version before the change is answered, so the
next request after a revoke reads the row again and is refused: revocation takes effect
at once, as without the cache. Only successful lookups are kept (an unknown token is
looked up every time, so a newly added client works at once too); the cache is bounded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from lmsp.store import clients
from lmsp.store.clients import Client
from lmsp.store.db import Database

TABLE = "clients"
SIZE = 1024

# runs a read function off the event loop (the service's reader pool)
Offload = Callable[[Callable[[], Client | None]], Awaitable[Client | None]]


class TokenCache:
    def __init__(self, db: Database, size: int = SIZE) -> None:
        self.db = db
        self.size = size
        self._entries: OrderedDict[str, tuple[int, Client]] = OrderedDict()
        self._lock = threading.Lock()  # lookups run in reader threads
        self.hits = 0
        self.misses = 0

    def cached(self, token: str) -> Client | None:
        """The client ``token`` authenticated under the current version, if known."""
        entry = self._entries.get(clients.hash_token(token))
        if entry is None or entry[0] != self.db.versions[TABLE]:
            return None
        self.hits += 1
        return entry[1]

    def lookup(self, token: str) -> Client | None:
        """Read the client of ``token`` from the database (any thread) and keep it."""
        version = self.db.versions[TABLE]  # before the read: see Versions
        client = clients.authenticate(self.db.reader(), token)
        with self._lock:
            self.misses += 1
            if client is not None:
                digest = clients.hash_token(token)
                self._entries[digest] = (version, client)
                self._entries.move_to_end(digest)
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return client

    async def authenticate(self, token: str, offload: Offload) -> Client | None:
        """The unrevoked client holding ``token``: from the cache, else read through
        ``offload`` (off the event loop)."""
        client = self.cached(token)
        if client is not None:
            return client
        return await offload(lambda: self.lookup(token))

    def version(self) -> int:
        """The ``clients`` table's version: unchanged means no client row changed."""
        return self.db.versions[TABLE]
