from __future__ import annotations

import sqlite3
from pathlib import Path

from lmsp.store import clients
from lmsp.store.db import connect
from lmsp.store.migrations import migrate


def db(tmp_path: Path) -> sqlite3.Connection:
    conn = connect(tmp_path / "c.db")
    migrate(conn)
    return conn


def test_only_a_hash_and_a_short_prefix_are_stored(tmp_path: Path) -> None:
    conn = db(tmp_path)
    client, token = clients.add(conn, "a", ["models:read"])
    assert token.startswith("lmsp_") and len(token) == 5 + 43  # 256 random bits
    row = conn.execute("SELECT * FROM clients").fetchone()
    assert row["token_hash"] == clients.hash_token(token) and token not in tuple(row)
    assert row["token_prefix"] == token[:11]
    assert clients.authenticate(conn, token) == client


def test_tokens_sharing_a_prefix_are_told_apart(tmp_path: Path) -> None:
    conn = db(tmp_path)
    first, token = clients.add(conn, "a", ["models:read"])
    twin = token[:11] + "x" * (len(token) - 11)
    conn.execute(
        "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
        " VALUES ('cli_twin', 'twin', ?, ?, '[\"admin\"]', 0)",
        (token[:11], clients.hash_token(twin)),
    )
    assert clients.authenticate(conn, token) == first
    twin_client = clients.authenticate(conn, twin)
    assert twin_client is not None and twin_client.id == "cli_twin"
    assert clients.authenticate(conn, token[:-1]) is None
    assert clients.authenticate(conn, "not-lmsp") is None


def test_revoked_clients_do_not_authenticate(tmp_path: Path) -> None:
    conn = db(tmp_path)
    client, token = clients.add(conn, "a", ["models:read"])
    row = clients.revoke(conn, client.id)
    assert row is not None and row["revoked_at"] is not None
    assert clients.authenticate(conn, token) is None


def test_touch_writes_at_most_once_a_minute(tmp_path: Path) -> None:
    conn = db(tmp_path)
    client, _ = clients.add(conn, "a", ["models:read"])
    assert clients.touch(conn, client.id, 1000)
    assert not clients.touch(conn, client.id, 1030)
    assert clients.touch(conn, client.id, 1060)
    assert clients.needs_touch(clients.Client("x", "x", (), 1000), 1060)
    assert not clients.needs_touch(clients.Client("x", "x", (), 1000), 1059)


def test_scopes_are_validated_and_ordered() -> None:
    assert clients.clean_scopes(["admin", "models:read", "admin"]) == ["models:read", "admin"]
    try:
        clients.clean_scopes(["root"])
    except ValueError as exc:
        assert "root" in str(exc)
    else:
        raise AssertionError("an unknown scope was accepted")
