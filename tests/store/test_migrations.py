from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lmsp.protocol.itemtypes import plain_all
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


def test_m008_turns_copied_histories_into_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn stored with a copy of its history drops it for a reference when the turn it
    continues is still there; one whose predecessor is gone keeps its copy."""
    from lmsp.store import migrations
    from lmsp.store import responses as response_store

    conn = connect(tmp_path / "old.db")
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:7])
    migrate(conn)
    monkeypatch.undo()
    conn.execute(
        "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
        " VALUES ('c', 'c', 'p', 'h', '[]', 0)"
    )

    def message(role: str, text: str, ident: str) -> dict[str, object]:
        kind = "output_text" if role == "assistant" else "input_text"
        return {
            "type": "message",
            "id": ident,
            "status": "completed",
            "role": role,
            "content": [{"type": kind, "text": text}],
        }

    a_in, a_out = message("user", "one", "m1"), message("assistant", "ONE", "m2")
    b_in, b_out = message("user", "two", "m3"), message("assistant", "TWO", "m4")
    rows = [
        ("r_a", {"model": "m", "input": [a_in]}, [a_out]),
        ("r_b", {"model": "m", "input": [b_in], "previous_response_id": "r_a",
                 "lmsp_history": [a_in, a_out]}, [b_out]),
        ("r_c", {"model": "m", "input": [message("user", "three", "m5")],
                 "previous_response_id": "r_gone", "lmsp_history": [a_in]}, []),
    ]  # fmt: skip
    for ident, request, output in rows:
        conn.execute(
            "INSERT INTO responses (id, client_id, model, created_at, request, background,"
            " store, output) VALUES (?, 'c', 'm', 0, ?, 0, 1, ?)",
            (ident, json.dumps(request), json.dumps(output)),
        )
    assert migrate(conn) == [name for name, _ in MIGRATIONS[7:]]  # m008 and later
    stored = {
        r["id"]: (json.loads(r["request"]), r["previous_id"])
        for r in conn.execute("SELECT id, request, previous_id FROM responses")
    }
    assert stored["r_b"][1] == "r_a" and "lmsp_history" not in stored["r_b"][0]
    assert stored["r_c"][1] is None and stored["r_c"][0]["lmsp_history"] == [a_in]
    context = plain_all(response_store.context_of(conn, "r_b"))
    assert context == [a_in, a_out, b_in, b_out]


OLD = Path(__file__).with_name("old")


def test_a_database_the_old_code_wrote_upgrades_without_running_a_step_again(
    tmp_path: Path,
) -> None:
    """A data directory from before the paired steps (the old code migrated it to m016
    and wrote rows: tests/store/old/m016.sql): opening it runs m017 and m018 only, the
    schema ends as a blank one's, the rows are there, and m018 counted the conversation."""
    path = tmp_path / "lmsp.db"
    raw = sqlite3.connect(path)
    raw.executescript((OLD / "m016.sql").read_text())
    raw.close()
    db = Database(path)
    db.close()
    conn = connect(path)
    ledger = dict(conn.execute("SELECT name, applied_at FROM _migrations").fetchall())
    assert sorted(ledger) == [name for name, _ in MIGRATIONS]
    assert {n for n, at in ledger.items() if at != 1700000000} == {
        "m017_webhook_updated_at",
        "m018_conversation_sizes",
    }
    assert dump_schema(conn) == EXPECTED.read_text()
    assert conn.execute("SELECT updated_at FROM webhooks").fetchone()[0] == 1700000100
    items = [r[0] for r in conn.execute("SELECT item FROM conversation_items")]
    size = conn.execute("SELECT item_count, item_bytes FROM conversations").fetchone()
    assert tuple(size) == (2, sum(len(item.encode()) for item in items))
    assert conn.execute("SELECT count(*) FROM task_events").fetchone()[0] == 2
    assert migrate(conn) == []
