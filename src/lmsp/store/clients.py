"""Clients and their tokens. Only a SHA-256 of a token and a short prefix are stored."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
from dataclasses import dataclass

from lmsp.ids import new_id
from lmsp.ids import now as _now

SCOPES = ("models:read", "models:write", "responses:read", "responses:write", "admin")
TOKEN_PREFIX = "lmsp_"


@dataclass(frozen=True)
class Client:
    id: str
    name: str
    scopes: tuple[str, ...]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def display_prefix(token: str) -> str:
    return token[: len(TOKEN_PREFIX) + 6]


def add(conn: sqlite3.Connection, name: str, scopes: list[str]) -> tuple[Client, str]:
    """Create a client; returns it with its token, which is never stored in clear."""
    token = new_token()
    client_id = new_id("cli")
    conn.execute(
        "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (client_id, name, display_prefix(token), hash_token(token), json.dumps(scopes), _now()),
    )
    return Client(client_id, name, tuple(scopes)), token


def authenticate(conn: sqlite3.Connection, token: str) -> Client | None:
    digest = hash_token(token)
    row = conn.execute(
        "SELECT id, name, token_hash, scopes FROM clients"
        " WHERE token_hash = ? AND revoked_at IS NULL",
        (digest,),
    ).fetchone()
    if row is None or not hmac.compare_digest(row["token_hash"], digest):
        return None
    return Client(row["id"], row["name"], tuple(json.loads(row["scopes"])))
