"""Conversations (the OpenAI Conversations API) on the durable store.

A conversation is a row owned by the client that made it, and its items, in the order
they were added (``seq``, one sequence for all conversations). A response created with
``conversation`` is bound to it (``responses.conversation_id``) and remembers the last
item it saw (``lmsp_conversation_upto`` in its stored request,
:attr:`~lmsp.protocol.request.PreparedRequest.conversation_upto`): its context is the
conversation's items up to that one, then its own input. When the response finishes, its input items
and its output items are appended in the same transaction as its terminal state
(:func:`on_finished`, called from :func:`lmsp.store.tasks.move`), so a crash never
leaves half a turn. As OpenAI's API does, only a response that completed (or ended
``incomplete``, e.g. at ``max_output_tokens``) adds its turn; a failed or cancelled one
adds nothing, and the client may send that turn again.

A conversation's size is bounded (:class:`Quota`: its items, their stored bytes, and the
bytes of all of a client's conversations), counted on its row (``item_count``,
``item_bytes``) as items come and go. A turn's context is read newest first, a page at a
time, only as far as the model's context holds it (:func:`newest_first`), never the
whole conversation. Retention deletes a conversation unused for its period once no
response of it is stored (:mod:`lmsp.store.retention`); deleting a response leaves the
items it added in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.protocol import items, objects
from lmsp.protocol import request as stored_request
from lmsp.protocol.itemtypes import InputItem, loads_one, plain_all
from lmsp.protocol.records import TaskRecord
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.states import Status
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row, clock_now

#: the most items one create (or one ``POST …/items``) may add, as OpenAI allows
MAX_ADD = 20
#: a page of ``GET …/items`` ends early (``has_more``) once it holds this many stored bytes
PAGE_BYTES = 4 << 20
#: a turn's context is read this many items at a time at first, doubling up to the last
FIRST_PAGE, LAST_PAGE = 16, 256

Item = dict[str, Any]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class Quota:
    """The most one conversation may hold (``items``, and ``bytes`` of stored items) and
    all of one client's conversations together (``client_bytes``); 0: no limit. An
    append that would pass one is refused whole (``409 conversation_quota_exceeded``)."""

    items: int = 0
    bytes: int = 0
    client_bytes: int = 0


def _quota_exceeded(message: str, param: str) -> LmspError:
    """Sending it again cannot help: the SDKs are told not to retry."""
    return LmspError(
        "conversation_quota_exceeded", message, param=param, headers={"x-should-retry": "false"}
    )


def _room(conn: Conn, head: Row, count: int, size: int, quota: Quota, param: str) -> None:
    """Raise unless the conversation ``head`` (its row) can take ``count`` more items of
    ``size`` stored bytes within ``quota``."""
    advice = (
        " Start a new conversation (POST /v1/responses/compact summarizes this one's items"
        " to carry over), or delete items or conversations you no longer need."
    )
    if quota.items and head["item_count"] + count > quota.items:
        raise _quota_exceeded(
            f"This conversation holds {head['item_count']} items; {count} more would pass"
            f" the {quota.items} one may hold (LMSP_CONVERSATION_MAX_ITEMS)." + advice,
            param,
        )
    if quota.bytes and head["item_bytes"] + size > quota.bytes:
        raise _quota_exceeded(
            f"This conversation holds {head['item_bytes']} bytes of items; {size} more"
            f" would pass the {quota.bytes} one may hold (LMSP_CONVERSATION_MAX_BYTES)." + advice,
            param,
        )
    if quota.client_bytes:
        held = conn.execute(
            "SELECT COALESCE(SUM(item_bytes), 0) FROM conversations WHERE client_id = ?",
            (head["client_id"],),
        ).fetchone()[0]
        if int(held) + size > quota.client_bytes:
            raise _quota_exceeded(
                f"This client's conversations hold {held} bytes of items; {size} more would"
                f" pass the {quota.client_bytes} a client's conversations may hold together"
                " (LMSP_CLIENT_CONVERSATION_BYTES)." + advice,
                param,
            )


def _size(adding: Sequence[InputItem]) -> int:
    """The stored bytes of items about to be added."""
    return sum(_stored(item)[1] for item in plain_all(adding))


def _stored(item: Item) -> tuple[str, int]:
    """An item as stored, and its bytes (what the quotas count)."""
    text = _dumps(item)
    return text, len(text.encode())


def not_found(conversation_id: str, param: str | None = None) -> LmspError:
    return LmspError("not_found", f"No conversation with id {conversation_id!r}.", param=param)


def render(row: Row) -> dict[str, Any]:
    """The ``conversation`` object."""
    return {
        "id": row["id"],
        "object": "conversation",
        "created_at": row["created_at"],
        "metadata": json.loads(row["metadata"]),
    }


def shown(item: Item) -> Item:
    """An item as the client reads it: without the text lmsp read from its files."""
    if item.get("type") != "message":
        return item
    content = [{k: v for k, v in part.items() if k != items.FILE_TEXT} for part in item["content"]]
    return {**item, "content": content}


# -- the conversation ------------------------------------------------------------------------
def create(
    conn: Conn,
    client_id: str,
    metadata: dict[str, str],
    initial: list[Item],
    quota: Quota | None = None,
) -> Row:
    """A new conversation with its first items (already normalized), within ``quota``."""
    stamp = clock_now(conn)
    row: Row = conn.execute(
        "INSERT INTO conversations (id, client_id, created_at, updated_at, metadata)"
        " VALUES (?, ?, ?, ?, ?) RETURNING *",
        (new_id("conv"), client_id, stamp, stamp, _dumps(metadata)),
    ).fetchone()
    if initial:
        append(conn, row["id"], initial, quota=quota)
    return row


def owned(conn: Conn, conversation_id: str, client: Client, param: str | None = None) -> Row:
    """The conversation, if ``client`` owns it (or is the admin, who sees all); ``404``
    for anything else, another client's included."""
    row: Row | None = conn.execute(
        "SELECT * FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None or not client.oversees(row["client_id"]):
        raise not_found(conversation_id, param)
    return row


def update(conn: Conn, conversation_id: str, client: Client, metadata: dict[str, str]) -> Row:
    owned(conn, conversation_id, client)
    row: Row = conn.execute(
        "UPDATE conversations SET metadata = ?, updated_at = ? WHERE id = ? RETURNING *",
        (_dumps(metadata), clock_now(conn), conversation_id),
    ).fetchone()
    return row


def delete(conn: Conn, conversation_id: str, client: Client) -> None:
    """Delete a conversation and its items (responses bound to it stay; a turn still
    unfinished then adds nothing)."""
    owned(conn, conversation_id, client)
    conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,))
    conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))


# -- items ----------------------------------------------------------------------------------
def append(
    conn: Conn,
    conversation_id: str,
    added: list[Item],
    response_id: str | None = None,
    *,
    quota: Quota | None = None,
    param: str = "items",
) -> list[Item]:
    """Append items (normalized, each with an id) in order, all or none: ``quota``
    given, items that would pass it are refused (``param`` names them). An id the
    conversation holds already is replaced by a fresh one (a client may send back an
    item it read). The conversation's row is updated first: on PostgreSQL that locks
    it, so two turns finishing at once on two nodes append one after the other, never
    interleaved."""
    stamp = clock_now(conn)
    head = conn.execute(
        "UPDATE conversations SET updated_at = ? WHERE id = ?"
        " RETURNING client_id, item_count, item_bytes",
        (stamp, conversation_id),
    ).fetchone()
    if head is None:  # deleted meanwhile (a sweep on another node): nothing to add to
        return []
    out: list[Item] = []
    rows: list[tuple[str, str]] = []
    for item in added:
        item = dict(item)
        taken = conn.execute(
            "SELECT 1 FROM conversation_items WHERE conversation_id = ? AND id = ?",
            (conversation_id, item["id"]),
        ).fetchone()
        if taken is not None or any(item["id"] == ident for ident, _ in rows):
            item["id"] = new_id(str(item["id"]).split("_", 1)[0] or "item")
        rows.append((item["id"], _stored(item)[0]))
        out.append(item)
    size = sum(len(text.encode()) for _, text in rows)
    if quota is not None:
        _room(conn, head, len(rows), size, quota, param)
    conn.executemany(
        "INSERT INTO conversation_items (conversation_id, id, item, response_id, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        [(conversation_id, ident, text, response_id, stamp) for ident, text in rows],
    )
    conn.execute(
        "UPDATE conversations SET item_count = item_count + ?, item_bytes = item_bytes + ?"
        " WHERE id = ?",
        (len(rows), size, conversation_id),
    )
    return out


#: the item of a conversation, by its id
_THE_ITEM = " FROM conversation_items WHERE conversation_id = ? AND id = ?"


def _one_item(conn: Conn, sql: str, conversation_id: str, item_id: str) -> str:
    """The stored text of the item ``sql`` finds (and returns); ``404`` when the
    conversation has no such item."""
    row = conn.execute(sql, (conversation_id, item_id)).fetchone()
    if row is None:
        raise LmspError("not_found", f"No item with id {item_id!r} in this conversation.")
    text: str = row[0]
    return text


def item(conn: Conn, conversation_id: str, item_id: str) -> Item:
    found: Item = json.loads(_one_item(conn, "SELECT item" + _THE_ITEM, conversation_id, item_id))
    return found


def delete_item(conn: Conn, conversation_id: str, item_id: str) -> None:
    gone = _one_item(conn, f"DELETE{_THE_ITEM} RETURNING item", conversation_id, item_id)
    conn.execute(
        "UPDATE conversations SET updated_at = ?, item_count = item_count - 1,"
        " item_bytes = item_bytes - ? WHERE id = ?",
        (clock_now(conn), len(gone.encode()), conversation_id),
    )


def page(
    conn: Conn, conversation_id: str, order: str, after: str | None, limit: int
) -> dict[str, Any]:
    """``GET …/items``: a page of items, ``asc`` (oldest first) or ``desc``, after the
    item ``after`` (``404`` naming ``after`` if there is no such item)."""
    clause = ""
    args: tuple[Any, ...] = ()
    if after is not None:
        mark = conn.execute(
            "SELECT seq FROM conversation_items WHERE conversation_id = ? AND id = ?",
            (conversation_id, after),
        ).fetchone()
        if mark is None:
            raise LmspError("not_found", f"No item with id {after!r}.", param="after")
        clause, args = (" AND seq > ?" if order == "asc" else " AND seq < ?"), (mark[0],)
    direction = "ASC" if order == "asc" else "DESC"
    rows = conn.execute(
        f"SELECT item FROM conversation_items WHERE conversation_id = ?{clause}"
        f" ORDER BY seq {direction} LIMIT ?",
        (conversation_id, *args, limit + 1),
    )
    data, more = _bounded(rows, limit)
    return objects.list_page([shown(item) for item in data], more)


def _bounded(rows: Iterable[Row], limit: int) -> tuple[list[Item], bool]:
    """At most ``limit`` items of ``rows`` (their first column), fewer once they hold
    :data:`PAGE_BYTES` (never none), and whether more are left: a page's bytes are
    bounded, not only its count."""
    found: list[Item] = []
    held = 0
    for row in rows:
        if len(found) == limit or (found and held >= PAGE_BYTES):
            return found, True
        held += len(row[0])
        found.append(json.loads(row[0]))
    return found, False


# -- a response's turn ------------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    """A piece of a history read newest first: one response's items (its input, then
    its output: :func:`lmsp.store.responses.newest_first`) or a page of a conversation's
    items, oldest first, and their stored bytes. ``older``, when set, counts what comes
    before it without reading it: how many items, and the oldest one."""

    items: list[InputItem]
    size: int
    older: Callable[[], tuple[int, InputItem | None]] | None = None


def newest_first(conn: Conn, conversation_id: str, upto: int) -> Iterator[Turn]:
    """The conversation's items up to the item ``upto``, a page at a time, the newest
    page first (:data:`FIRST_PAGE` items, doubling up to :data:`LAST_PAGE`), each read
    only when it is asked for: a turn reads only as much as the model's context holds
    (:func:`lmsp.app.fitting.fit`). Items deleted since are left out; a conversation
    deleted since gives none."""
    below, size = upto + 1, FIRST_PAGE
    while True:
        rows = conn.execute(
            "SELECT seq, item FROM conversation_items WHERE conversation_id = ? AND seq < ?"
            " ORDER BY seq DESC LIMIT ?",
            (conversation_id, below, size),
        ).fetchall()
        if not rows:
            return
        below = int(rows[-1][0])
        found = [loads_one(row[1]) for row in reversed(rows)]
        last = len(rows) < size
        older = None if last else _counter(conn, conversation_id, below)
        yield Turn(found, sum(len(row[1]) for row in rows), older)
        if last:
            return
        size = min(2 * size, LAST_PAGE)


def _counter(
    conn: Conn, conversation_id: str, below: int
) -> Callable[[], tuple[int, InputItem | None]]:
    def count() -> tuple[int, InputItem | None]:
        """How many items come before ``below``, and the oldest (read alone)."""
        found = conn.execute(
            "SELECT COUNT(*), MIN(seq) FROM conversation_items"
            " WHERE conversation_id = ? AND seq < ?",
            (conversation_id, below),
        ).fetchone()
        if not found[0]:
            return 0, None
        oldest = conn.execute(
            "SELECT item FROM conversation_items WHERE seq = ?", (found[1],)
        ).fetchone()
        return int(found[0]), loads_one(oldest[0]) if oldest else None

    return count


def newest(conn: Conn, request: PreparedRequest, count: int) -> list[InputItem]:
    """The ``count`` newest items of a turn's conversation context, oldest first: all a
    runner reads of a conversation ``truncation: "auto"`` cut short."""
    turn = request.turn
    if turn is None or count <= 0:
        return []
    rows = conn.execute(
        "SELECT item FROM conversation_items WHERE conversation_id = ? AND seq <= ?"
        " ORDER BY seq DESC LIMIT ?",
        (*turn, count),
    ).fetchall()
    return [loads_one(row[0]) for row in reversed(rows)]


def history(conn: Conn, request: PreparedRequest) -> list[InputItem] | None:
    """The conversation items a stored request's context starts with (``None``: it was
    not made with ``conversation``). Items deleted since are left out; a conversation
    deleted since gives none. Whole: for a turn whose context held them all."""
    turn = request.turn
    if turn is None:
        return None
    rows = conn.execute(
        "SELECT item FROM conversation_items WHERE conversation_id = ? AND seq <= ? ORDER BY seq",
        turn,
    ).fetchall()
    return [loads_one(row[0]) for row in rows]


def input_page(
    conn: Conn, request: PreparedRequest, order: str, after: str | None, limit: int
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items`` of a turn: its conversation's items up to
    the last its context held (those deleted since left out), then its own input, as a
    page read from the database alone, never the whole conversation."""
    turn = request.turn
    assert turn is not None
    conversation_id, upto = turn
    asc = order == "asc"
    own = [shown(item) for item in plain_all(request.input)]
    if not asc:
        own.reverse()
    ids = [item.get("id") for item in own]

    def held(past: int | None, count: int) -> tuple[list[Item], bool]:
        clause = "" if past is None else (" AND seq > ?" if asc else " AND seq < ?")
        rows = conn.execute(
            "SELECT item FROM conversation_items WHERE conversation_id = ? AND seq <= ?"
            f"{clause} ORDER BY seq {'ASC' if asc else 'DESC'} LIMIT ?",
            (conversation_id, upto, *(() if past is None else (past,)), count + 1),
        )
        found, more = _bounded(rows, count)
        return [shown(item) for item in found], more

    def given(offset: int | None, count: int) -> tuple[list[Item], bool]:
        rest = own[offset or 0 :]
        return rest[:count], len(rest) > count

    def in_held(item_id: str) -> int | None:
        row = conn.execute(
            "SELECT seq FROM conversation_items WHERE conversation_id = ? AND id = ? AND seq <= ?",
            (conversation_id, item_id, upto),
        ).fetchone()
        return None if row is None else int(row[0])

    def in_given(item_id: str) -> int | None:
        return ids.index(item_id) + 1 if item_id in ids else None

    parts = [(held, in_held), (given, in_given)] if asc else [(given, in_given), (held, in_held)]
    first, mark = 0, None
    if after is not None:  # the page starts past that item, in the part that holds it
        for index, (_, find) in enumerate(parts):
            if (mark := find(after)) is not None:
                first = index
                break
        else:
            raise LmspError("not_found", f"No input item with id {after!r}.", param="after")
    data: list[Item] = []
    for index in range(first, len(parts)):
        got, more = parts[index][0](mark if index == first else None, limit - len(data))
        data.extend(got)
        if more:
            return objects.list_page(data, True)
    return objects.list_page(data, False)


def start(
    conn: Conn, conversation_id: str, client: Client, quota: Quota, adding: Sequence[InputItem]
) -> int:
    """A new turn: the ``seq`` of the conversation's last item, the end of its context
    (``404`` naming ``conversation`` unless ``client`` owns it; ``409`` if its input,
    ``adding``, would pass a quota). Reads no item."""
    row = owned(conn, conversation_id, client, param="conversation")
    _room(conn, row, len(adding), _size(adding), quota, "conversation")
    last = conn.execute(
        "SELECT MAX(seq) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()[0]
    return int(last or 0)


def bind(
    conn: Conn,
    response_id: str,
    conversation_id: str,
    client: Client,
    quota: Quota,
    adding: Sequence[InputItem],
) -> None:
    """A response made with ``conversation``: its turn goes there when it finishes
    (``404`` if the conversation was deleted since the request was read, ``409`` if its
    input would now pass a quota; its output is appended whole when it finishes, even
    past one). A turn is a use: the conversation's retention counts from now."""
    owned(conn, conversation_id, client, param="conversation")
    head = conn.execute(
        "UPDATE conversations SET updated_at = ? WHERE id = ?"
        " RETURNING client_id, item_count, item_bytes",
        (clock_now(conn), conversation_id),
    ).fetchone()
    if head is None:  # swept meanwhile on another node
        raise not_found(conversation_id, "conversation")
    _room(conn, head, len(adding), _size(adding), quota, "conversation")
    conn.execute(
        "UPDATE responses SET conversation_id = ? WHERE id = ?", (conversation_id, response_id)
    )


def on_finished(conn: Conn, task: TaskRecord, target: Status) -> None:
    """A task reached a terminal state (inside :func:`lmsp.store.tasks.move`): if its
    response belongs to a conversation and completed (``incomplete`` included), append
    its input items and then its output items, in this transaction."""
    if target is not Status.COMPLETED:
        return
    row = conn.execute(
        "SELECT r.id, r.conversation_id, r.request, r.output FROM responses r"
        " JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ?",
        (task.response_id,),
    ).fetchone()
    if row is None:  # no conversation, or it was deleted meanwhile
        return
    request = stored_request.loads(row["request"])
    output = json.loads(row["output"]) if row["output"] else []
    append(conn, row["conversation_id"], [*plain_all(request.input), *output], row["id"])
