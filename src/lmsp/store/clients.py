"""Clients and their tokens.

A token is ``lmsp_`` + 256 random bits, shown once. The database keeps only its SHA-256
and a short non-secret prefix (for lookup and display); a presented token is found by
its prefix and its hash compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lmsp.errors import unauthorized
from lmsp.ids import new_id
from lmsp.ids import now as _now
from lmsp.protocol.records import typed
from lmsp.store.sql import Conn, Row

SCOPES = (
    "models:read",
    "models:write",
    "responses:read",
    "responses:write",
    "admin",
    "priority",  # may ask for service_tier "priority" (PROTOCOL.md 13)
)
TOKEN_PREFIX = "lmsp_"
PREFIX_CHARS = 6
# ``last_used_at`` is written at most this often per client (seconds)
TOUCH_INTERVAL = 60


@dataclass(frozen=True)
class Client:
    id: str
    name: str
    scopes: tuple[str, ...]
    last_used_at: int | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    @property
    def admin(self) -> bool:
        """The owner's role: sees, lists and cancels every client's responses and tasks."""
        return "admin" in self.scopes

    def oversees(self, owner_id: str) -> bool:
        """Whether this client may see an object owned by ``owner_id``."""
        return self.admin or owner_id == self.id


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def display_prefix(token: str) -> str:
    return token[: len(TOKEN_PREFIX) + PREFIX_CHARS]


def clean_scopes(scopes: Iterable[str]) -> list[str]:
    """Known scopes, deduplicated, in canonical order; ``ValueError`` names an unknown one."""
    wanted = set(scopes)
    unknown = sorted(wanted - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope {unknown[0]!r} (known: {', '.join(SCOPES)})")
    return [s for s in SCOPES if s in wanted]


def add(conn: Conn, name: str, scopes: list[str]) -> tuple[Client, str]:
    """Create a client; returns it with its token, which is never stored in clear."""
    token = new_token()
    client_id = new_id("cli")
    conn.execute(
        "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (client_id, name, display_prefix(token), hash_token(token), json.dumps(scopes), _now()),
    )
    return Client(client_id, name, tuple(scopes)), token


def authenticate(conn: Conn, token: str) -> Client | None:
    """The unrevoked client holding ``token``: rows are found by the non-secret prefix,
    then every candidate's hash is compared in constant time."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
        return None
    digest = hash_token(token)
    found: Client | None = None
    for row in conn.execute(
        "SELECT id, name, token_hash, scopes, last_used_at FROM clients"
        " WHERE token_prefix = ? AND revoked_at IS NULL",
        (display_prefix(token),),
    ):
        if hmac.compare_digest(row["token_hash"], digest):
            found = typed(Client, row, "scopes")
    return found


def load(conn: Conn, client_id: str) -> Client | None:
    """An unrevoked client by id (the console's session names its client by id)."""
    row = conn.execute(
        "SELECT id, name, scopes, last_used_at FROM clients WHERE id = ? AND revoked_at IS NULL",
        (client_id,),
    ).fetchone()
    if row is None:
        return None
    return typed(Client, row, "scopes")


def needs_touch(client: Client, now: int) -> bool:
    return client.last_used_at is None or now - client.last_used_at >= TOUCH_INTERVAL


def touch(conn: Conn, client_id: str, now: int) -> bool:
    """Record a use; a no-op when one was recorded less than a minute ago."""
    cur = conn.execute(
        "UPDATE clients SET last_used_at = ? WHERE id = ?"
        " AND (last_used_at IS NULL OR last_used_at <= ?)",
        (now, client_id, now - TOUCH_INTERVAL),
    )
    return cur.rowcount == 1


def ensure_active(conn: Conn, client_id: str) -> None:
    """In a write that acts for ``client_id`` (a create): raise ``401 invalid_token`` if
    the client was revoked since its request was authenticated. On PostgreSQL the
    client's row stays locked until the commit, so a revoke cannot slip in between."""
    row = conn.execute(
        f"SELECT revoked_at FROM clients WHERE id = ?{conn.for_update}", (client_id,)
    ).fetchone()
    if row is None or row["revoked_at"] is not None:
        raise unauthorized("This client's token was revoked while the request was being made.")


def get(conn: Conn, client_id: str) -> Row | None:
    row: Row | None = conn.execute("SELECT * FROM clients WHERE id = ?", (client_id,)).fetchone()
    return row


def all_clients(conn: Conn) -> list[Row]:
    return list(conn.execute("SELECT * FROM clients ORDER BY created_at, id"))


def set_scopes(conn: Conn, client_id: str, scopes: list[str]) -> None:
    """Replace a client's scopes (token caches drop it at their next look)."""
    conn.execute("UPDATE clients SET scopes = ? WHERE id = ?", (json.dumps(scopes), client_id))


def revoke(conn: Conn, client_id: str) -> Row | None:
    """Revoke a client (once; revoking again keeps the first time). The caller cancels
    its unfinished tasks in the same transaction (:func:`lmsp.store.tasks.unfinished_of`)."""
    conn.execute(
        "UPDATE clients SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (_now(), client_id),
    )
    return get(conn, client_id)


def render(row: Row) -> dict[str, Any]:
    """The wire object: never the hash, only the display prefix."""
    return {
        "id": row["id"],
        "object": "client",
        "name": row["name"],
        "token_prefix": row["token_prefix"],
        "scopes": json.loads(row["scopes"]),
        "created_at": row["created_at"],
        "last_used_at": row["last_used_at"],
        "revoked_at": row["revoked_at"],
    }
