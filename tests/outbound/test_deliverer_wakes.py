"""The webhook sender looks at its outbox after a commit that changed it, not after
every commit: on one SQLite database the outbox's changes are counted, so the commits of
generating tasks (a flush of text every 100 ms each) do not wake the sender's loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.outbound import deliverer
from lmsp.outbound.deliverer import Deliverer, DeliveryPolicy
from lmsp.store import clients as client_store
from lmsp.store import webhooks
from lmsp.store.db import Database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(tmp_path / "lmsp.db")
    yield database
    database.close()


def looks(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the sender reads which deliveries are due, from now on."""
    seen: list[float] = []
    real = webhooks.due

    def counted(*args: Any) -> Any:
        seen.append(time.monotonic())
        return real(*args)

    monkeypatch.setattr(deliverer.store, "due", counted)
    return seen


def settled(seen: list[float], quiet: float = 0.2) -> None:
    """Until the sender has not looked for ``quiet`` seconds (its start's look)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        last = seen[-1] if seen else 0.0
        time.sleep(quiet)
        if (seen[-1] if seen else 0.0) == last:
            return
    raise AssertionError("the sender kept looking")


def test_commits_that_leave_the_outbox_alone_do_not_wake_the_sender(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = looks(monkeypatch)
    sender = Deliverer(db, DeliveryPolicy(retry=1.0, give_up=60.0, hosts=()), None)
    sender.start()
    try:
        settled(seen)
        before = len(seen)
        began = time.monotonic()
        for i in range(40):  # commits of other tables, 20 ms apart, as tasks' flushes are
            db.write_sync(lambda c, i=i: client_store.add(c, f"agent {i}", ["responses:write"]))
            time.sleep(0.02)
        spent = time.monotonic() - began
        time.sleep(0.1)
        # at most its own nap's looks (one a second), none a commit
        assert len(seen) - before <= int(spent + 0.1) + 1, (len(seen) - before, spent)
        # a commit that queues a delivery wakes it at once
        client = db.write_sync(lambda c: client_store.add(c, "hooked", ["responses:write"]))
        client_id = client[0].id
        db.write_sync(
            lambda c: webhooks.add(
                c, client_id, "http://127.0.0.1:9/h", ["response.completed"], "", False
            )
        )
        settled(seen, 0.05)
        before = len(seen)
        db.write_sync(
            lambda c: c.execute(
                "INSERT INTO webhook_deliveries (event_id, webhook_id, type, response_id,"
                " client_id, created_at, status, next_attempt_at)"
                " SELECT 'evt_x', id, 'response.completed', 'resp_x', client_id, 0, 'pending',"
                " 1e12 FROM webhooks"
            )
        )
        deadline = time.monotonic() + 0.5  # well within its nap of a second
        while len(seen) == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(seen) > before
    finally:
        sender.stop()
