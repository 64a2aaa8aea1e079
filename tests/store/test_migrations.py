from __future__ import annotations

import sqlite3
from pathlib import Path

from lmsp.store.db import Database, connect
from lmsp.store.migrations import MIGRATIONS, applied, migrate, schema_version

EXPECTED = Path(__file__).with_name("expected_schema.sql")


def dump_schema(conn: sqlite3.Connection) -> str:
    rows = conn.execute(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
        " ORDER BY type DESC, name"
    )
    return "\n".join(" ".join(r[0].split()) + ";" for r in rows) + "\n"


def test_blank_database_migrates_to_the_expected_schema(tmp_path: Path) -> None:
    conn = connect(tmp_path / "blank.db")
    assert migrate(conn) == [name for name, _ in MIGRATIONS]
    assert dump_schema(conn) == EXPECTED.read_text()
    assert schema_version(conn) == MIGRATIONS[-1][0]


def test_migrating_again_changes_nothing(tmp_path: Path) -> None:
    conn = connect(tmp_path / "twice.db")
    migrate(conn)
    before = dump_schema(conn)
    assert migrate(conn) == []
    assert dump_schema(conn) == before
    assert applied(conn) == sorted(name for name, _ in MIGRATIONS)


def test_the_chapter_11_tables_exist(tmp_path: Path) -> None:
    conn = connect(tmp_path / "tables.db")
    migrate(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {
        "service_config",
        "clients",
        "models",
        "responses",
        "tasks",
        "task_events",
        "idempotency_keys",
    } <= tables


def test_connections_use_the_durable_pragmas(tmp_path: Path) -> None:
    db = Database(tmp_path / "p.db")
    try:
        conn = db.reader()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    finally:
        db.close()


def test_an_older_database_upgrades_in_place(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from lmsp.store import migrations

    conn = connect(tmp_path / "old.db")
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:1])
    assert migrations.migrate(conn) == ["m001_initial"]
    conn.execute(
        "INSERT INTO models (id, format, engine, digest, size_bytes, owned_by, position,"
        " created_at) VALUES ('m', 'gguf', 'llama_cpp', 'sha256:00', 1, 'lmsp', 0, 0)"
    )
    monkeypatch.undo()
    assert migrate(conn) == [name for name, _ in MIGRATIONS[1:]]
    assert dump_schema(conn) == EXPECTED.read_text()
    assert conn.execute("SELECT status FROM models WHERE id = 'm'").fetchone()[0] == "ready"


def test_m004_moves_output_text_into_message_items(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from lmsp.store import migrations

    conn = connect(tmp_path / "m004.db")
    names = [name for name, _ in MIGRATIONS]
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[: names.index("m004_output_items")])
    migrations.migrate(conn)
    conn.execute(
        "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
        " VALUES ('cli_1', 'c', 'p', 'h', '[]', 0)"
    )
    rows = [
        ("resp_done", "hello", None),
        ("resp_cut", "partial", "max_output_tokens"),
        ("resp_running", None, None),
    ]
    for rid, text, reason in rows:
        conn.execute(
            "INSERT INTO responses (id, client_id, model, created_at, request, background, store,"
            " output_text, message_id, incomplete_reason) VALUES (?, 'cli_1', 'm', 0, '{}', 0, 1,"
            " ?, ?, ?)",
            (rid, text, "msg_" + rid, reason),
        )
    monkeypatch.undo()
    assert migrate(conn) == names[names.index("m004_output_items") :]
    out = {r[0]: r[1] for r in conn.execute("SELECT id, output FROM responses")}
    assert json.loads(out["resp_done"]) == [
        {
            "type": "message",
            "id": "msg_resp_done",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert json.loads(out["resp_cut"])[0]["status"] == "incomplete"
    assert out["resp_running"] is None  # its log says what it has so far
