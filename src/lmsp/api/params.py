"""Query parameters several routes take alike: a page of items (``order``, ``after``,
``limit``, ``include``) and a stream asked for again (``stream``, ``starting_after``,
``Last-Event-ID``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Header, Query

from lmsp.api import inputs

Order = Literal["asc", "desc"]
#: the ``include`` values a route is asked for (each checked by the route)
Includes = Annotated[list[str], Query(max_length=16)]


@dataclass(frozen=True)
class ItemsPage:
    order: Order
    after: str | None
    limit: int
    include: list[str]


def _items_page(
    order: Order = "desc",
    after: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    include: Includes = [],  # noqa: B006 (FastAPI copies)
) -> ItemsPage:
    return ItemsPage(order, after, limit, include)


#: ``?order=&after=&limit=&include=`` of a list of items (newest first by default)
ItemsQuery = Annotated[ItemsPage, Depends(_items_page)]


@dataclass(frozen=True)
class Replay:
    """``stream=true``: the log again, after ``starting_after`` or the
    ``Last-Event-ID``, whichever is later (:attr:`after`, checked when read)."""

    stream: bool
    starting_after: int
    last_event_id: str | None

    @property
    def after(self) -> int:
        return inputs.resume_after(self.starting_after, self.last_event_id)


def _replay(
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1, le=inputs.MAX_SEQUENCE)] = -1,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Replay:
    return Replay(stream, starting_after, last_event_id)


#: ``?stream=&starting_after=`` and ``Last-Event-ID`` of a retrieve
ReplayQuery = Annotated[Replay, Depends(_replay)]
