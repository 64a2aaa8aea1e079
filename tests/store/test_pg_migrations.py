"""The PostgreSQL schema, migrated on a blank database, agrees with SQLite's: the same
tables with the same columns, so every store verb reads and writes the same rows."""

from __future__ import annotations

from pathlib import Path

import psycopg

from lmsp.store import pg_schema
from lmsp.store.db import connect
from lmsp.store.migrations import migrate


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
