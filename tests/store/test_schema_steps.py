"""The schema's steps: one list, each step in both dialects, under the ids that
databases' ``_migrations`` ledgers already record."""

from __future__ import annotations

import re

import pytest

from lmsp.store import migrations, pg_schema, schema

#: the ledger ids that shipped: an existing database has recorded them, so they are
#: never renamed (a renamed step would run a second time on every such database)
SHIPPED_SQLITE = [
    "m001_initial", "m002_pairing", "m003_model_state", "m004_output_items",
    "m005_pairing_source", "m006_model_defaults", "m007_snapshot_tokens",
    "m008_history_by_reference", "m009_nodes", "m010_node_clock", "m011_model_aliases",
    "m012_webhooks", "m013_conversations", "m014_model_pulls", "m015_mcp_headers",
    "m016_fair_share", "m017_webhook_updated_at", "m018_conversation_sizes",
    "m019_remote_models",
]  # fmt: skip
SHIPPED_POSTGRES = ["p001_schema"] + ["p" + name[1:] for name in SHIPPED_SQLITE[8:]]


def test_every_step_has_both_forms() -> None:
    for step in schema.STEPS:
        assert step.sqlite.strip(), f"{step.sqlite_id}: no SQLite form"
        assert step.postgres.strip(), f"{step.sqlite_id}: no PostgreSQL form"
        found = re.search(r"\bSTRICT\b|\bROWID\b|AUTOINCREMENT|json_\w+\(|RAISE\(", step.postgres)
        assert found is None, f"{step.sqlite_id}: SQLite's words in its PostgreSQL form"


def test_each_step_is_one_migration_in_each_dialect_after_the_baseline() -> None:
    for number, step in enumerate(schema.STEPS, start=1):
        assert re.fullmatch(rf"m{number:03d}_\w+", step.sqlite_id), step.sqlite_id
        if number <= 8:  # PostgreSQL began with the schema these left: one migration
            assert step.postgres_id == schema.BASELINE
        else:
            assert step.postgres_id == "p" + step.sqlite_id[1:]


def test_the_shipped_ids_stay() -> None:
    assert [name for name, _ in migrations.MIGRATIONS][: len(SHIPPED_SQLITE)] == SHIPPED_SQLITE
    assert [name for name, _ in pg_schema.MIGRATIONS][: len(SHIPPED_POSTGRES)] == (SHIPPED_POSTGRES)


def test_the_baseline_is_steps_one_to_eight_in_postgres_words() -> None:
    baseline = dict(pg_schema.MIGRATIONS)[schema.BASELINE]
    assert baseline == "".join(s.postgres for s in schema.STEPS[:8])
    assert "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY" in baseline
    assert "output_text" not in baseline  # dropped by step 4 before PostgreSQL began


def test_a_shared_part_in_sqlite_words_only_is_refused() -> None:
    """A new step whose shared text uses what PostgreSQL does not have fails at once,
    naming it: that part is written for each dialect (a Fork)."""
    with pytest.raises(ValueError, match="json_extract"):
        schema.step("m099_x", "UPDATE t SET a = json_extract(b, '$.c');")
    made = schema.step(
        "m099_x",
        "ALTER TABLE t ADD COLUMN n INTEGER NOT NULL DEFAULT 0;\n",
        schema.Fork(
            sqlite="UPDATE t SET n = length(CAST(b AS BLOB));",
            postgres="UPDATE t SET n = octet_length(b);",
        ),
    )
    assert made.postgres_id == "p099_x"
    assert made.sqlite.endswith("length(CAST(b AS BLOB));") and "INTEGER" in made.sqlite
    assert made.postgres == (
        "ALTER TABLE t ADD COLUMN n BIGINT NOT NULL DEFAULT 0;\nUPDATE t SET n = octet_length(b);"
    )


def test_postgres_words() -> None:
    sql = """CREATE TABLE t (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, b BLOB, n INTEGER
    ) STRICT, WITHOUT ROWID;
    CREATE TABLE u (id TEXT PRIMARY KEY) STRICT;"""
    words = (
        "CREATE TABLE t ( seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " at DOUBLE PRECISION NOT NULL, b BYTEA, n BIGINT );"
        " CREATE TABLE u (id TEXT PRIMARY KEY);"
    )
    assert " ".join(schema.postgres(sql).split()) == words
