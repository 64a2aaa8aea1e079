"""The PostgreSQL schema, migrated on a blank database, agrees with SQLite's: the same
tables with the same columns, so every store verb reads and writes the same rows."""

from __future__ import annotations

from pathlib import Path

import psycopg

from lmsp.store import pg_schema
from lmsp.store.db import connect
from lmsp.store.migrations import migrate

HERE = Path(__file__).parent
#: the schema a blank database gets from the code before the paired steps, described
#: by :func:`describe` (regenerate it with ``describe`` when a new step changes it)
EXPECTED = HERE / "expected_pg_schema.txt"

#: the catalog, as far as lmsp's reads and writes see it: every column (type, null,
#: default, identity), constraint, index, trigger and function of the public schema
CATALOG = {
    "columns": """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
        a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0
          AND NOT a.attisdropped ORDER BY c.relname, a.attnum""",
    "constraints": """SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
        ORDER BY c.relname, k.conname""",
    "indexes": """SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY indexname""",
    "triggers": """SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal ORDER BY tgname""",
    "functions": """SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
        ORDER BY p.proname""",
    "sequences": """SELECT sequencename, data_type, start_value, increment_by
        FROM pg_sequences WHERE schemaname = 'public' ORDER BY sequencename""",
}


def describe(url: str) -> str:
    """The database's schema as text, a line for each thing, white space folded."""
    lines: list[str] = []
    with psycopg.connect(url) as conn:
        for name, query in CATALOG.items():
            lines.append(f"-- {name}")
            for row in conn.execute(query):
                lines.append(" ".join(" | ".join(str(value) for value in row).split()))
    return "\n".join(lines) + "\n"


def _pg_columns(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name <> '_migrations'"
            " ORDER BY table_name, column_name"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def _sqlite_columns(path: Path) -> dict[str, list[str]]:
    conn = connect(path)
    migrate(conn)
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' AND name <> '_migrations'"
        )
    ]
    return {t: sorted(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in tables}


def test_blank_postgres_database_migrates_to_the_sqlite_schema(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert pg_schema.migrate(conn) == [name for name, _ in pg_schema.MIGRATIONS]
    assert _pg_columns(pg_url) == _sqlite_columns(tmp_path / "same.db")


def test_migrating_postgres_again_changes_nothing(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        pg_schema.migrate(conn)
        before = _pg_columns(pg_url)
        assert pg_schema.migrate(conn) == []
        names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
    assert _pg_columns(pg_url) == before
    assert names == sorted(name for name, _ in pg_schema.MIGRATIONS)


def test_nodes_starting_together_migrate_once(pg_url: str) -> None:
    """Two nodes opening a blank database at once: the advisory lock lets one apply
    each migration, the other finds it applied."""
    import threading

    results: list[list[str]] = []

    def run() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            results.append(pg_schema.migrate(conn))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = sorted(name for result in results for name in result)
    assert applied == sorted(name for name, _ in pg_schema.MIGRATIONS)


def test_a_blank_database_gets_the_schema_it_always_got(pg_url: str) -> None:
    """Steps 1 to 8 run together as ``p001_schema`` make what the hand-written
    ``p001_schema`` made: every column, constraint, index, trigger and function."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        pg_schema.migrate(conn)
    assert describe(pg_url) == EXPECTED.read_text()


def test_a_database_the_old_code_wrote_upgrades_without_running_a_step_again(
    pg_url: str,
) -> None:
    """A database from before the paired steps (the old code migrated it to p016 and
    wrote rows: tests/store/old/p016.sql, pg_dump's): p017 to p019 run, nothing
    else, the schema ends as a blank one's, the rows are there, and p018 counted the
    conversation."""
    script = (HERE / "old" / "p016.sql").read_text()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(script)  # type: ignore[call-overload]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert pg_schema.migrate(conn) == [
            "p017_webhook_updated_at",
            "p018_conversation_sizes",
            "p019_remote_models",
        ]
        names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
        assert names == sorted(name for name, _ in pg_schema.MIGRATIONS)
        assert conn.execute("SELECT updated_at FROM webhooks").fetchone() == (1700000100,)
        items = [r[0] for r in conn.execute("SELECT item FROM conversation_items")]
        size = conn.execute("SELECT item_count, item_bytes FROM conversations").fetchone()
        assert size == (2, sum(len(item.encode()) for item in items))
        assert conn.execute("SELECT count(*) FROM task_events").fetchone() == (2,)
        assert pg_schema.migrate(conn) == []
    assert describe(pg_url) == EXPECTED.read_text()
