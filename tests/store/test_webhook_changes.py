"""Changing a webhook in the store, on SQLite and PostgreSQL alike: an update changes
only what differs (and ``updated_at`` only then), a rotation replaces the secret the
next claim signs with, and the newest-first page walks every webhook once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.store import clients as client_store
from lmsp.store import webhooks
from lmsp.store.db import Database
from lmsp.store.pg import PgDatabase

EVENTS = ["response.completed"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        database: Any = Database(tmp_path / "lmsp.db")
    else:
        database = PgDatabase(request.getfixturevalue("pg_url"), readers=2)
    yield database
    database.close()


def a_client(db: Any) -> str:
    made = db.write_sync(lambda c: client_store.add(c, "hooks", ["responses:write"]))
    return str(made[0].id)


def test_update_rotate_and_page(db: Any) -> None:
    client_id = a_client(db)
    row, secret = db.write_sync(
        lambda c: webhooks.add(c, client_id, "http://127.0.0.1:9/a", EVENTS, "n", False)
    )
    hook = row["id"]
    assert row["updated_at"] == row["created_at"]
    same = db.write_sync(lambda c: webhooks.update(c, hook, url="http://127.0.0.1:9/a"))
    assert same is not None and same[1] == {}
    time.sleep(1.05)  # updated_at is in seconds
    changed = db.write_sync(
        lambda c: webhooks.update(c, hook, events=["response.failed"], description="m")
    )
    assert changed is not None
    fresh, change = changed
    assert change == {"events": ["response.failed"], "description": "m"}
    assert fresh["url"] == "http://127.0.0.1:9/a" and fresh["updated_at"] > row["created_at"]
    rotated = db.write_sync(lambda c: webhooks.rotate(c, hook))
    assert rotated is not None and rotated[1] != secret
    assert rotated[0]["secret"] == rotated[1]
    assert db.write_sync(lambda c: webhooks.rotate(c, "wh_nope")) is None
    assert db.write_sync(lambda c: webhooks.update(c, "wh_nope", description="x")) is None
    more = [
        db.write_sync(
            lambda c, i=i: webhooks.add(
                c, client_id, f"http://127.0.0.1:9/{i}", EVENTS, None, False
            )
        )[0]["id"]
        for i in range(4)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        page = webhooks.newest_first(db.reader(), client_id, cursor, 2)
        seen += [r["id"] for r in page]
        if len(page) < 2:
            break
        cursor = page[-1]
    assert sorted(seen) == sorted([hook, *more]) and len(seen) == 5
    assert webhooks.newest_first(db.reader(), None, None, 10)[-1]["id"] == hook
