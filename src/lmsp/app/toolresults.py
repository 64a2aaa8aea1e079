"""A tool output must answer a call: each ``function_call_output`` (a chat ``tool``
message, a Messages ``tool_result``) whose ``call_id`` no earlier item of the input has
is looked up in the history the request continues (``previous_response_id`` or
``conversation``), newest first, and refused (``400``) when no call there has it either —
as OpenAI refuses "No tool call found for function call output". The history is read
only for outputs the input itself does not answer, and only as far back as the calls
are found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from lmsp.protocol import items
from lmsp.protocol.itemtypes import Compaction, FunctionCall, FunctionCallOutput, InputItem
from lmsp.store import conversations as conversation_store
from lmsp.store import responses as response_store
from lmsp.store.sql import Conn


def unanswered(given: Iterable[InputItem]) -> dict[str, int]:
    """The ``function_call_output`` items whose ``call_id`` no earlier ``function_call``
    of ``given`` has: ``{call_id: index}`` (the first). A ``compaction`` item hides the
    calls it summarised: the outputs after one are taken as answered."""
    calls: set[str] = set()
    orphans: dict[str, int] = {}
    for index, item in enumerate(given):
        if isinstance(item, Compaction):
            return {}
        if isinstance(item, FunctionCall):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput) and item.call_id not in calls:
            orphans.setdefault(item.call_id, index)
    return orphans


def _history(
    conn: Conn, previous: str | None, conversation: tuple[str, int] | None
) -> Iterator[conversation_store.Turn]:
    if previous is not None:
        yield from response_store.newest_first(conn, previous)
    elif conversation is not None:
        yield from conversation_store.newest_first(conn, *conversation)


def check(
    conn: Conn,
    given: Sequence[InputItem],
    previous: str | None,
    conversation: tuple[str, int] | None,
    name: Callable[[int], str],
) -> None:
    """Raise ``400 invalid_value`` (``param``: the output's ``call_id``, the item named
    by ``name(index)``) for the first tool output of ``given`` that answers no call of
    it or of the history it continues (``previous``, or ``conversation``: its id and
    the last item the turn sees)."""
    left = unanswered(given)
    if not left:
        return
    for turn in _history(conn, previous, conversation):
        for item in turn.items:
            if isinstance(item, Compaction):  # the calls it summarised are not listed
                return
            if isinstance(item, FunctionCall):
                left.pop(item.call_id, None)
        if not left:
            return
    call_id, index = next(iter(left.items()))
    raise items.no_call_for(call_id, f"{name(index)}.call_id")
