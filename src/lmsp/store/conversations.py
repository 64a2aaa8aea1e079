"""Conversations (the OpenAI Conversations API) on the durable store.

A conversation is a row owned by the client that made it, and its items, in the order
they were added (``seq``, one sequence for all conversations). A response created with
``conversation`` is bound to it (``responses.conversation_id``) and remembers the last
item it saw (:data:`UPTO`, in its stored request): its context is the conversation's
items up to that one, then its own input. When the response finishes, its input items
and its output items are appended in the same transaction as its terminal state
(:func:`on_finished`, called from :func:`lmsp.store.tasks.move`), so a crash never
leaves half a turn. As OpenAI's API does, only a response that completed (or ended
``incomplete``, e.g. at ``max_output_tokens``) adds its turn; a failed or cancelled one
adds nothing, and the client may send that turn again.

Retention never deletes a conversation or its items; deleting a response leaves the
items it added in place.
"""

from __future__ import annotations

import json
from typing import Any

from lmsp.errors import LmspError
from lmsp.ids import new_id
from lmsp.ids import now as _now
from lmsp.protocol import items, objects
from lmsp.protocol.states import Status
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row

#: a stored request's key for the ``seq`` of the last conversation item its context holds
UPTO = "lmsp_conversation_upto"
#: the most items one create (or one ``POST …/items``) may add, as OpenAI allows
MAX_ADD = 20

Item = dict[str, Any]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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
def create(conn: Conn, client_id: str, metadata: dict[str, str], initial: list[Item]) -> Row:
    """A new conversation with its first items (already normalized)."""
    stamp = _now()
    row: Row = conn.execute(
        "INSERT INTO conversations (id, client_id, created_at, updated_at, metadata)"
        " VALUES (?, ?, ?, ?, ?) RETURNING *",
        (new_id("conv"), client_id, stamp, stamp, _dumps(metadata)),
    ).fetchone()
    if initial:
        append(conn, row["id"], initial)
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
        (_dumps(metadata), _now(), conversation_id),
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
    conn: Conn, conversation_id: str, added: list[Item], response_id: str | None = None
) -> list[Item]:
    """Append items (normalized, each with an id) in order; an id the conversation
    holds already is replaced by a fresh one (a client may send back an item it read).
    The conversation's row is updated first: on PostgreSQL that locks it, so two turns
    finishing at once on two nodes append one after the other, never interleaved."""
    stamp = _now()
    conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (stamp, conversation_id))
    out: list[Item] = []
    for item in added:
        item = dict(item)
        taken = conn.execute(
            "SELECT 1 FROM conversation_items WHERE conversation_id = ? AND id = ?",
            (conversation_id, item["id"]),
        ).fetchone()
        if taken is not None:
            item["id"] = new_id(str(item["id"]).split("_", 1)[0] or "item")
        conn.execute(
            "INSERT INTO conversation_items (conversation_id, id, item, response_id, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (conversation_id, item["id"], _dumps(item), response_id, stamp),
        )
        out.append(item)
    return out


def item(conn: Conn, conversation_id: str, item_id: str) -> Item:
    row = conn.execute(
        "SELECT item FROM conversation_items WHERE conversation_id = ? AND id = ?",
        (conversation_id, item_id),
    ).fetchone()
    if row is None:
        raise LmspError("not_found", f"No item with id {item_id!r} in this conversation.")
    found: Item = json.loads(row[0])
    return found


def delete_item(conn: Conn, conversation_id: str, item_id: str) -> None:
    cur = conn.execute(
        "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?",
        (conversation_id, item_id),
    )
    if cur.rowcount != 1:
        raise LmspError("not_found", f"No item with id {item_id!r} in this conversation.")
    conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (_now(), conversation_id))


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
    ).fetchall()
    data = [shown(json.loads(row[0])) for row in rows[:limit]]
    return objects.list_page(data, len(rows) > limit)


# -- a response's turn ------------------------------------------------------------------------
def context(conn: Conn, conversation_id: str, upto: int | None = None) -> tuple[list[Item], int]:
    """The conversation's items (up to the item ``upto``, when given), oldest first, and
    the ``seq`` of the last one (``0`` when there is none)."""
    bound = "" if upto is None else " AND seq <= ?"
    args: tuple[Any, ...] = (conversation_id,) if upto is None else (conversation_id, upto)
    rows = conn.execute(
        f"SELECT seq, item FROM conversation_items WHERE conversation_id = ?{bound} ORDER BY seq",
        args,
    ).fetchall()
    last = int(rows[-1][0]) if rows else 0
    return [json.loads(row[1]) for row in rows], last


def history(conn: Conn, request: dict[str, Any]) -> list[Item] | None:
    """The conversation items a stored request's context starts with (``None``: it was
    not made with ``conversation``). Items deleted since are left out; a conversation
    deleted since gives none."""
    conversation = request.get("conversation")
    if not isinstance(conversation, dict) or UPTO not in request:
        return None
    found, _ = context(conn, str(conversation["id"]), int(request[UPTO]))
    return found


def start(conn: Conn, conversation_id: str, client: Client) -> tuple[list[Item], int]:
    """A new turn's context: the conversation's items so far and the ``seq`` of the
    last one (``404`` naming ``conversation`` unless ``client`` owns it)."""
    owned(conn, conversation_id, client, param="conversation")
    return context(conn, conversation_id)


def bind(conn: Conn, response_id: str, conversation_id: str, client: Client) -> None:
    """A response made with ``conversation``: its turn goes there when it finishes
    (``404`` if the conversation was deleted since the request was read)."""
    owned(conn, conversation_id, client, param="conversation")
    conn.execute(
        "UPDATE responses SET conversation_id = ? WHERE id = ?", (conversation_id, response_id)
    )


def on_finished(conn: Conn, task: Row, target: Status) -> None:
    """A task reached a terminal state (inside :func:`lmsp.store.tasks.move`): if its
    response belongs to a conversation and completed (``incomplete`` included), append
    its input items and then its output items, in this transaction."""
    if target is not Status.COMPLETED:
        return
    row = conn.execute(
        "SELECT r.id, r.conversation_id, r.request, r.output FROM responses r"
        " JOIN conversations c ON c.id = r.conversation_id WHERE r.id = ?",
        (task["response_id"],),
    ).fetchone()
    if row is None:  # no conversation, or it was deleted meanwhile
        return
    request = json.loads(row["request"])
    output = json.loads(row["output"]) if row["output"] else []
    append(conn, row["conversation_id"], [*items.input_of(request), *output], row["id"])
