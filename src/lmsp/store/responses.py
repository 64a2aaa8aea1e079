"""Responses: creating one (with its task, first events and idempotency key) atomically,
and the history of a conversation.

A turn of a conversation (``previous_response_id``) is stored with only its own input
and a reference to the response it continues (``previous_id``); its history is the
chain of those references, expanded when it is needed (:func:`request_of`). So a
conversation's bytes grow by each turn's own size, not by the history's, and deleting a
response removes its content from every later turn too: a turn whose history lost a
response can no longer be run or continued (``history_deleted``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.ids import now as _now
from lmsp.protocol import events as ev
from lmsp.protocol import itemtypes, objects
from lmsp.protocol.itemtypes import InputItem, Items
from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.request import dumps as dump_request
from lmsp.protocol.request import loads as load_request
from lmsp.protocol.states import FINISHED_SQL, Status
from lmsp.store import conversations, events, idempotency, limits
from lmsp.store import tasks as task_store
from lmsp.store.conversations import Turn
from lmsp.store.sql import Conn, Row


@dataclass(frozen=True)
class Created:
    response_id: str
    task_id: str
    status_code: int
    replayed: bool
    # the object as committed (status ``queued``); ``None`` on a replay
    response: dict[str, Any] | None = None


def create(
    conn: Conn,
    *,
    client_id: str,
    request: PreparedRequest,
    on_restart: str,
    max_queue: int,
    key: idempotency.Key | None,
) -> Created:
    """Persist a response, its task, ``response.created`` (and ``response.queued``).

    Runs in one transaction with the idempotency key row, so a retried request never
    makes two tasks. Raises ``queue_full`` when the queue is full, ``idempotency_key_reused``
    on a reused key, ``idempotency_key_spent`` when the key's response is gone.
    """
    background = bool(request.background)
    status_code = 202 if background else 200
    if key is not None:
        stored = idempotency.lookup(conn, key)
        if stored is not None and stored.resource_id is not None:
            resp = task_store.get_response(conn, stored.resource_id)
            if resp is not None:
                task = conn.execute(
                    "SELECT id FROM tasks WHERE response_id = ?", (resp.id,)
                ).fetchone()
                return Created(resp.id, task[0], stored.status_code, replayed=True)
            # the key made a response that is gone (``store: false``, deleted, swept):
            # it can be neither replayed nor used to make a second one
            raise LmspError(
                "idempotency_key_spent",
                f"This Idempotency-Key created {stored.resource_id}, which is no longer"
                " stored (store was false, or it was deleted), so its result cannot be"
                " replayed; send a new key to create another response.",
                param="Idempotency-Key",
            )
    limits.check(conn, client_id)  # over a client's limit: 429, nothing written
    queued = task_store.queued_count(conn)
    if queued >= max_queue:
        raise LmspError(
            "queue_full",
            f"The queue holds {max_queue} tasks already; retry later.",
            headers={"Retry-After": "5"},
        )
    stamp = _now()
    response_id = new_id("resp")
    task_id = new_id("task")
    # the rows as stored (RETURNING): the first events render them with no reads back
    inserted = conn.execute(
        "INSERT INTO responses (id, client_id, model, created_at, request, background, store,"
        " previous_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
        (
            response_id,
            client_id,
            request.model,
            stamp,
            dump_request(request),  # its history by reference (``previous_id``)
            int(background),
            int(request.store is not False),
            request.previous_response_id,
        ),
    )
    response = ResponseRecord.of(inserted.fetchone())
    task = TaskRecord.of(
        conn.execute(
            "INSERT INTO tasks (id, response_id, client_id, status, on_restart, attempt,"
            " last_sequence_number, created_at, updated_at, tier)"
            " VALUES (?, ?, ?, 'queued', ?, 1, -1, ?, ?, ?) RETURNING *",
            (task_id, response_id, client_id, on_restart, stamp, stamp, tier_of(request)),
        ).fetchone()
    )
    # no output yet; its place in the fair order the claim follows
    obj = objects.render_response(response, task, [], task_store.queue_position(conn, task))
    batch = [ev.lifecycle(ev.CREATED, obj)]
    if background:
        batch.append(ev.lifecycle(ev.QUEUED, obj))
    events.append(conn, task_id, batch)
    if key is not None:
        idempotency.record(conn, key, status_code, response_id)
    return Created(response_id, task_id, status_code, replayed=False, response=obj)


def tier_of(request: PreparedRequest) -> int:
    tier = request.service_tier or "default"
    return task_store.TIERS.get(tier, task_store.DEFAULT_TIER)


def delete(conn: Conn, response_id: str, client_id: str) -> str:
    """Delete a finished response with its task and events; ``"conflict"``/``"missing"``."""
    row = conn.execute(
        "SELECT t.status FROM responses r JOIN tasks t ON t.response_id = r.id"
        " WHERE r.id = ? AND r.client_id = ?",
        (response_id, client_id),
    ).fetchone()
    if row is None:
        return "missing"
    cur = conn.execute(
        "DELETE FROM responses WHERE id = ? AND id IN (SELECT response_id FROM tasks"
        f" WHERE status IN ({FINISHED_SQL}))",
        (response_id,),
    )
    return "deleted" if cur.rowcount == 1 else "conflict"


def conversation(conn: Conn, previous_id: str, client_id: str) -> list[InputItem]:
    """The context a response continuing ``previous_id`` starts from: that response's
    own context (its history and input) and then its output. Only the caller's stored,
    finished responses can be continued: ``404 not_found`` for anything else (another
    client's, missing, deleted, swept, ``store: false``), ``409 response_in_progress``
    while it is unfinished, ``409 history_deleted`` when a response of its history was
    deleted."""
    continuable(conn, previous_id, client_id)
    return context_of(conn, previous_id)


def continuable(conn: Conn, previous_id: str, client_id: str) -> None:
    """Raise unless the caller may continue ``previous_id`` (see :func:`conversation`);
    reads no content, only the chain of ids."""
    row = conn.execute(
        "SELECT r.store, t.status FROM responses r"
        " JOIN tasks t ON t.response_id = r.id WHERE r.id = ? AND r.client_id = ?",
        (previous_id, client_id),
    ).fetchone()
    if row is None or not row["store"]:
        raise LmspError(
            "not_found",
            f"previous_response_id: no stored response with id {previous_id!r}.",
            param="previous_response_id",
        )
    if not Status(row["status"]).terminal:
        raise LmspError(
            "response_in_progress",
            f"previous_response_id: the response {previous_id!r} is still {row['status']};"
            " a conversation continues from a finished response.",
            param="previous_response_id",
        )
    _chain(conn, previous_id, ids_only=True)


#: the responses a turn continues, newest first: ``depth`` 0 is the turn itself
_CHAIN = """
WITH RECURSIVE chain(id, previous_id, depth) AS (
    SELECT id, previous_id, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.id, r.previous_id, chain.depth + 1 FROM responses r
    JOIN chain ON r.id = chain.previous_id
)
"""


def _chain(conn: Conn, response_id: str, *, ids_only: bool) -> list[Row]:
    """The response and every response it continues, oldest first (with their request
    and output unless ``ids_only``); ``history_deleted`` if one of them is gone."""
    columns = "c.id, c.previous_id" + ("" if ids_only else ", r.request, r.output")
    rows = conn.execute(
        f"{_CHAIN} SELECT {columns} FROM chain c JOIN responses r ON r.id = c.id"
        " ORDER BY c.depth DESC",
        (response_id,),
    ).fetchall()
    if not rows:
        raise history_deleted(response_id)
    if rows[0]["previous_id"] is not None:  # the oldest continues a missing one
        raise history_deleted(rows[0]["previous_id"])
    return rows


def history_deleted(gone: str) -> LmspError:
    return LmspError(
        "history_deleted",
        f"previous_response_id: the response {gone!r}, part of this conversation's history,"
        " was deleted (or expired): the history is gone, so the conversation cannot be"
        " continued. Start a new conversation with the turns you need as input.",
        param="previous_response_id",
    )


def context_of(conn: Conn, response_id: str) -> list[InputItem]:
    """Everything of a stored response a later turn sees: its history, its input and
    its output (``history_deleted`` if a response of its history is gone)."""
    out: list[InputItem] = []
    for row in _chain(conn, response_id, ids_only=False):
        seen, started = _seen(conn, load_request(row["request"]), row["output"])
        if started:
            out = seen
        else:
            out.extend(seen)
    return out


def newest_first(conn: Conn, response_id: str) -> Iterator[Turn]:
    """What :func:`context_of` gives, a response at a time, the newest first, each read
    only when it is asked for: a caller that needs only the newest items of a long
    conversation stops early, and never holds the rest (``history_deleted`` if a
    response of it is gone, before the first). A chain that starts from a turn of a
    conversation (``conversation``) goes on with that conversation's items, a page at a
    time (:func:`lmsp.store.conversations.newest_first`)."""
    chain = _chain(conn, response_id, ids_only=True)
    for link in reversed(chain):
        row = conn.execute(
            "SELECT request, output FROM responses WHERE id = ?", (link["id"],)
        ).fetchone()
        if row is None:  # deleted while it was read
            raise history_deleted(link["id"])
        request = load_request(row["request"])
        size = len(row["request"]) + len(row["output"] or "")
        started = request.turn
        if request.history is not None or started is None:
            seen, whole = _seen(conn, request, row["output"])
            yield Turn(seen, size)
            if whole:  # its own history is all that came before it
                return
            continue
        yield Turn([*request.input, *_output(row["output"])], size)
        yield from conversations.newest_first(conn, *started)
        return


def _seen(conn: Conn, request: PreparedRequest, output: str | None) -> tuple[list[InputItem], bool]:
    """The items a later turn sees of one stored response, and whether they start with
    a history of its own (then what came before it is in there already)."""
    started = True
    seen: list[InputItem]
    if request.history is not None:  # stored before history was kept by reference
        seen = list(request.history)
    elif (found := conversations.history(conn, request)) is not None:
        seen = found  # a turn of a conversation (``conversation``)
    else:
        seen, started = [], False
    seen.extend(request.input)
    seen.extend(_output(output))
    return seen, started


def _output(output: str | None) -> Items:
    return itemtypes.loads(output) if output else ()


def request_of(conn: Conn, response: ResponseRecord) -> PreparedRequest:
    """A stored response's request with its history expanded (what the model is
    given). ``history_deleted`` (an :class:`LmspError`) if a response of its history was
    deleted meanwhile."""
    request = response.request
    if request.history is not None:  # stored inline (an earlier version)
        return request
    history: list[InputItem] | None = None
    if response.previous_id is not None:
        history = context_of(conn, response.previous_id)
    else:  # a turn of a conversation: its items so far
        history = conversations.history(conn, request)
    if history is None:
        return request
    return msgspec.structs.replace(request, history=tuple(history))


def given_request(conn: Conn, response: ResponseRecord) -> PreparedRequest:
    """:func:`request_of`, with only as much of the history as the model is given: a
    turn ``truncation: "auto"`` cut short (its record says how many items it ``kept``)
    reads its history newest first until it holds those, never the older ones it left
    out. The runner's one read of a task's request."""
    request = response.request
    kept = request.truncated.kept if request.truncated is not None else None
    previous = response.previous_id
    if kept is None or request.history is not None:
        return request_of(conn, response)
    wanted = kept - len(request.input)
    if previous is None:  # a turn of a conversation (else it has no history to cut)
        newest_items = conversations.newest(conn, request, wanted)
        return msgspec.structs.replace(request, history=tuple(newest_items))
    newest: list[list[InputItem]] = []
    held = 0
    if wanted <= 0:  # none of it: still, the whole history must be there
        _chain(conn, previous, ids_only=True)
    else:
        for turn in newest_first(conn, previous):
            newest.append(turn.items)
            held += len(turn.items)
            if held >= wanted:
                break
    history = tuple(item for seen in reversed(newest) for item in seen)
    return msgspec.structs.replace(request, history=history)


def input_items(
    conn: Conn, response: ResponseRecord, order: str, after: str | None, limit: int
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items``: a page of the items its model was given;
    a turn of a conversation's page is read alone, never the whole conversation."""
    request = response.request
    if request.history is None and request.turn is not None:
        return conversations.input_page(conn, request, order, after, limit)
    return objects.input_items_page(request_of(conn, response), order, after, limit)
