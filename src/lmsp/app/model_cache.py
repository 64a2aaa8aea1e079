"""The model records creates resolve, kept in the API process (issue 40: a create used to
look its model up in a reader thread each time).

A create names its model by id or alias; :class:`ModelCache` keeps, for each name, the
record it resolved to, the row that record was read from (its *stamp*:
:func:`lmsp.store.aliases.stamp`) and the version of the ``models`` and
``model_aliases`` tables it was read under (:class:`lmsp.store.db.Versions`).

What it guarantees:

- **No create commits under a record the database no longer holds.** The create's own
  write transaction reads the row its model's name resolves to now, unparsed, and
  compares it with the stamp its request was prepared with
  (:func:`check`); a model removed, changed (its digest, status, defaults, upstream,
  position) or an alias pointed elsewhere — by this process, by another node sharing
  a PostgreSQL database, by anything that writes the table — refuses that write
  (:class:`Changed`), nothing of it is written, and the create is prepared once more
  from a fresh read (``404 model_not_found`` if the model is gone). This holds with or
  without the cache, on either store: the cache cannot make a create run stale.
- **A change made through this process is seen by the next create without that
  round:** on SQLite the writer's triggers bump the tables' version before the change
  is answered, and an entry read under an older version is read again (a reader
  thread). On PostgreSQL another node's change is not heard (no notification carries
  it): the create's transaction finds it, one retry.
- Only creates use it; listing, showing and counting a model's tokens read the table
  as before. At most :data:`SIZE` names are kept (the least recently used go first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lmsp.errors import LmspError
from lmsp.store import aliases
from lmsp.store.aliases import Stamp
from lmsp.store.db import Database
from lmsp.store.models import ModelRecord
from lmsp.store.sql import Conn

#: names kept at most
SIZE = 256
#: the tables a record depends on (either one changed: read again)
TABLES = ("models", "model_aliases")


@dataclass(frozen=True)
class Resolved:
    """What a model name resolved to, and the row it was read from."""

    name: str
    record: ModelRecord
    stamp: Stamp


class Changed(Exception):
    """The model a create was prepared with changed before its write: prepare again."""


def check(conn: Conn, resolved: Resolved) -> None:
    """In the create's transaction: the name still resolves to the row the request was
    prepared with. :class:`Changed` if not (a removed model included: the fresh read
    then says ``404``)."""
    if aliases.stamp(conn, resolved.name) != resolved.stamp:
        raise Changed(resolved.name)


class ModelCache:
    """Names → :class:`Resolved`, trusted while the tables' version is unchanged; used
    on the event loop only (no lock)."""

    def __init__(self, db: Database, size: int = SIZE) -> None:
        self.db = db
        self.size = size
        self._entries: OrderedDict[str, tuple[int, Resolved]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def version(self) -> int:
        return sum(self.db.versions[table] for table in TABLES)

    async def resolve(
        self, name: str, read: Callable[[Callable[[], Resolved | None]], Awaitable[Resolved | None]]
    ) -> Resolved | None:
        """``name``'s record: kept, else read through ``read`` (a reader thread) and
        kept; ``None``: it names no model (not kept, so one added is found at once)."""
        entry = self._entries.get(name)
        if entry is not None and entry[0] == self.version():
            self.hits += 1
            self._entries.move_to_end(name)
            return entry[1]
        version = self.version()  # before the read: see Versions

        def fresh() -> Resolved | None:
            found = aliases.resolve_stamped(self.db.reader(), name)
            return None if found is None else Resolved(name, *found)

        resolved = await read(fresh)
        self.misses += 1
        if resolved is None:
            self._entries.pop(name, None)
            return None
        self._entries[name] = (version, resolved)
        self._entries.move_to_end(name)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return resolved

    def forget(self, name: str) -> None:
        """A create found ``name``'s entry outdated (:class:`Changed`)."""
        self._entries.pop(name, None)


def changing(name: str) -> LmspError:
    """The model kept changing while a create was prepared (every try found it
    changed before its write): ``409``, the client may send it again."""
    return LmspError(
        "conflict",
        f"The model {name!r} changed while the request was prepared; send it again.",
        param="model",
    )
