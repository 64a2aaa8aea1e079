"""A tool output must answer a call: each ``function_call_output`` (a chat ``tool``
message, a Messages ``tool_result``) whose ``call_id`` no earlier item of the input has
is looked up in the history the request continues (``previous_response_id`` or
``conversation``), newest first, and refused (``400``) when no call there has it either —
as OpenAI refuses "No tool call found for function call output". The history is read
only for outputs the input itself does not answer, and only as far back as the calls
are found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lmsp.protocol import items
from lmsp.store import conversations as conversation_store
from lmsp.store import responses as response_store
from lmsp.store.sql import Conn


def _history(conn: Conn, request: dict[str, Any]) -> Iterator[conversation_store.Turn]:
    previous = request.get("previous_response_id")
    if previous is not None:
        yield from response_store.newest_first(conn, previous)
        return
    conversation = (request.get("conversation") or {}).get("id")
    if conversation is not None and conversation_store.UPTO in request:
        yield from conversation_store.newest_first(
            conn, conversation, request[conversation_store.UPTO]
        )


def check(conn: Conn, request: dict[str, Any], name: Callable[[int], str]) -> None:
    """Raise ``400 invalid_value`` (``param``: the output's ``call_id``, named by
    ``name(index)``) for the first tool output of ``request["input"]`` that answers no
    call of the input or of its history."""
    left = items.unanswered(request["input"])
    if not left:
        return
    for turn in _history(conn, request):
        for item in turn.items:
            kind = item.get("type")
            if kind == "compaction":  # the calls it summarised are not listed
                return
            if kind == "function_call":
                left.pop(item.get("call_id"), None)  # type: ignore[arg-type]
        if not left:
            return
    call_id, index = next(iter(left.items()))
    raise items.no_call_for(call_id, f"{name(index)}.call_id")
