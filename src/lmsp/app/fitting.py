"""How much of a turn's context the model is given, and its size in tokens.

Why: a turn continuing ``previous_response_id`` used to read its whole history and
render and tokenize all of it, several times, to count it: an 18-turn chain of 150 KB
requests held megabytes of items and tokens per request, and the API process kept the
memory. What the model can be given is bounded by its context, so that is all that is
read now.

How: the history is read a response at a time, newest first
(:func:`lmsp.store.responses.newest_first`), and the prompt is measured each time what
was read has doubled in stored bytes (so the tokenizing adds up to a few times the
prompt's own). Once the newest items alone fill the context, the older ones can only
be dropped (``truncation: "auto"``; it drops the oldest first) or make the prompt too
long (``"disabled"``): the reading stops. The fewest items that make it fit are found
among those read, as before; the older ones are then only counted, a response at a
time, for the record of what was dropped (:func:`lmsp.runner.plan.truncate`), or by one
count in the database when the history is a conversation's items (:attr:`Turn.older`).
A history that fits is read whole, and everything comes out as it did when it was
always read whole (the same items, order, counts and record).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import msgspec

from lmsp.protocol.itemtypes import InputItem
from lmsp.protocol.request import PreparedRequest
from lmsp.runner.plan import truncate
from lmsp.store.conversations import Turn

Item = InputItem
#: the prompt's ``(tokens, context)`` with these context items (``None``: not known)
Measure = Callable[[list[Item]], tuple[int, int] | None]
#: an exact count reads a history on until the prompt holds this many contexts
EXACT_BOUND = 4


class Size(NamedTuple):
    """A prompt's tokens and the model's context; ``whole``: false when the reading
    stopped at a full context (the prompt has at least ``tokens``)."""

    tokens: int
    context: int
    whole: bool = True


def fit(
    request: PreparedRequest, history: Iterable[Turn], measure: Measure, *, exact: bool = False
) -> tuple[Size | None, PreparedRequest]:
    """The size of ``request``'s prompt after the ``history`` it continues (newest
    first), and ``request`` holding that history as far as the model can be given it.
    With ``truncation: "auto"`` a prompt too long for the context loses its oldest
    context items, the fewest that make it fit (the last item always stays; recorded in
    the request given back). ``exact``: an over-long prompt without ``"auto"`` is read
    on, for its exact count (what ``/v1/responses/input_tokens`` answers), up to
    :data:`EXACT_BOUND` times the context (past that, ``whole`` is false: a history the
    size of many contexts is never read and tokenized whole for a count)."""
    auto = request.truncation == "auto"
    bound = EXACT_BOUND if exact and not auto else 1
    own = list(request.input)
    turns = iter(history)
    newest: list[Turn] = []  # the responses (or pages) read, newest first
    read = 0  # their stored bytes
    measured = -1  # ``read`` when the prompt was last measured
    got: tuple[int, int] | None = None
    full = False
    for turn in turns:
        newest.append(turn)
        read += turn.size
        if read < 2 * measured:
            continue
        got, measured = measure([*_held(newest), *own]), read
        if got is None:  # not known before it runs: the runner reads it again
            break
        if got[0] >= bound * got[1]:
            full = True
            break
    held = _held(newest)
    request = truncate(msgspec.structs.replace(request, history=tuple(held)), 0)
    if measured != read:  # the history was read whole since it was last measured
        got = measure([*held, *own])
    if got is None:
        return None, request
    if got[0] < got[1] or not auto:
        return Size(got[0], got[1], not full), request
    context = [*held, *own]
    low, high = 1, len(context) - 1  # the fewest that fit is in here
    best: tuple[int, tuple[int, int]] | None = None
    while low <= high:  # fewer dropped items never make a prompt shorter
        middle = (low + high) // 2
        size = measure(context[middle:])
        if size is None:
            return None, request
        if size[0] < size[1]:
            best, high = (middle, size), middle - 1
        else:
            low = middle + 1
    if best is None:  # even its last item alone does not fit
        return Size(got[0], got[1], not full), request
    unread, oldest = _unread(newest[-1] if newest else None, turns)
    request = truncate(request, best[0], unread=unread, oldest=oldest)
    return Size(best[1][0], best[1][1]), request


def _held(newest: list[Turn]) -> list[Item]:
    return [item for turn in reversed(newest) for item in turn.items]


def _unread(last: Turn | None, turns: Iterator[Turn]) -> tuple[int, Item | None]:
    """How many items come before ``last``, the oldest one read, and the oldest of them:
    counted where they are stored when they can be (:attr:`Turn.older`), else read a
    response at a time, never held."""
    if last is not None and last.older is not None:
        return last.older()
    unread, oldest = 0, None
    for turn in turns:
        unread += len(turn.items)
        oldest = turn.items[0] if turn.items else oldest
        if turn.older is not None:  # a conversation's items: the rest by one count
            more, first = turn.older()
            return unread + more, first or oldest
    return unread, oldest
