"""The webhook outbox in the store: the delivery row commits with the terminal state or
not at all; one event per end, under one id for every webhook that hears it; a claim
is exclusive and fences its outcome; retention keeps pending rows; due deliveries
come in turns between the clients that own the webhooks (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.app.service import Service
from lmsp.protocol.request import from_stored
from lmsp.store import clients as client_store
from lmsp.store import responses as response_store
from lmsp.store import service as service_store
from lmsp.store import tasks as task_store
from lmsp.store import webhooks
from lmsp.store.db import Database
from lmsp.store.pg import PgDatabase

ALL = ["response.completed", "response.incomplete", "response.failed", "response.cancelled"]


def owner(conn: Any) -> str:
    found = service_store.get(conn, "owner_client_id")
    assert found is not None
    return found


def queued(svc: Service, client_id: str | None = None) -> tuple[str, str]:
    def job(conn: Any) -> tuple[str, str]:
        made = response_store.create(
            conn,
            client_id=client_id or owner(conn),
            request=from_stored(
                {"model": "lmsp-test", "input": "x", "background": True, "seed": 1}
            ),
            on_restart="fail",
            max_queue=100,
            key=None,
        )
        return made.response_id, made.task_id

    result: tuple[str, str] = svc.db.write_sync(job)
    return result


def rows(svc: Service) -> list[Any]:
    return list(svc.db.reader().execute("SELECT * FROM webhook_deliveries ORDER BY seq"))


def hook(svc: Service, events: list[str], client_id: str | None = None, **kw: Any) -> str:
    def job(conn: Any) -> str:
        row, _ = webhooks.add(
            conn, client_id or owner(conn), "http://127.0.0.1:9/", events, None, False, **kw
        )
        return str(row["id"])

    result: str = svc.db.write_sync(job)
    return result


class Boom(Exception):
    pass


def test_the_delivery_commits_with_the_terminal_state_or_not_at_all(svc: Service) -> None:
    hook(svc, ALL)
    _, task_id = queued(svc)

    def fail_then_break(conn: Any) -> None:
        assert task_store.fail(conn, task_id, "engine_error", "no") is not None
        assert len(list(conn.execute("SELECT * FROM webhook_deliveries"))) == 1
        raise Boom  # the transaction (job) rolls back: neither the end nor the event stays

    with pytest.raises(Boom):
        svc.db.write_sync(fail_then_break)
    assert task_store.get(svc.db.reader(), task_id).status == "queued"
    assert rows(svc) == []
    svc.db.write_sync(lambda c: task_store.fail(c, task_id, "engine_error", "no"))
    (row,) = rows(svc)
    assert row["type"] == "response.failed" and row["status"] == "pending"
    # a terminal state never changes: a later cancel writes no second event
    assert svc.db.write_sync(lambda c: task_store.cancel(c, task_id)) is None
    assert len(rows(svc)) == 1


def test_one_event_id_for_every_webhook_that_hears_it(svc: Service) -> None:
    first, second = hook(svc, ALL), hook(svc, ["response.cancelled"])
    deaf = hook(svc, ["response.completed"])
    _, task_id = queued(svc)
    svc.db.write_sync(lambda c: task_store.cancel(c, task_id))
    found = rows(svc)
    assert {r["webhook_id"] for r in found} == {first, second}
    assert deaf not in {r["webhook_id"] for r in found}
    assert len({r["event_id"] for r in found}) == 1


def test_a_revoked_clients_webhooks_hear_nothing(svc: Service) -> None:
    other, _ = svc.db.write_sync(lambda c: client_store.add(c, "agent", ["responses:write"]))
    hook(svc, ALL, client_id=other.id)
    _, task_id = queued(svc, other.id)
    svc.db.write_sync(lambda c: client_store.revoke(c, other.id))
    svc.db.write_sync(lambda c: task_store.cancel(c, task_id))
    assert rows(svc) == []


def test_a_claim_is_exclusive_and_fences_its_outcome(svc: Service) -> None:
    hook(svc, ALL)
    _, task_id = queued(svc)
    svc.db.write_sync(lambda c: task_store.cancel(c, task_id))
    now = time.time() + 1
    seqs = [d.seq for d in webhooks.due(svc.db.reader(), now, 4, 16, 10)]
    first = svc.db.write_sync(lambda c: webhooks.claim(c, seqs, "a", now, 60))
    again = svc.db.write_sync(lambda c: webhooks.claim(c, seqs, "b", now, 60))
    assert len(first) == 1 and again == []  # leased: not due for another 60 s
    assert webhooks.due(svc.db.reader(), now + 1, 4, 16, 10) == []
    item = first[0]
    stale = webhooks.Outcome(item.seq, "clm_other", True, 200, None, now, None)
    assert svc.db.write_sync(lambda c: webhooks.settle(c, [stale])) == 0
    # a node starting again gives back its claims: due at once
    assert svc.db.write_sync(lambda c: webhooks.release(c, "a", now)) == 1
    retaken = svc.db.write_sync(lambda c: webhooks.claim(c, seqs, "b", now, 60))
    assert len(retaken) == 1 and retaken[0].attempts == 2
    done = webhooks.Outcome(item.seq, retaken[0].claim, True, 204, None, now, None)
    assert svc.db.write_sync(lambda c: webhooks.settle(c, [done])) == 1
    (row,) = rows(svc)
    assert row["status"] == "delivered" and row["last_status"] == 204
    # retention (an age of -10 s: everything attempted before 10 s from now) takes
    # delivered rows, never pending ones
    _, other_task = queued(svc)
    svc.db.write_sync(lambda c: task_store.cancel(c, other_task))
    assert svc.db.write_sync(lambda c: webhooks.delete_done_batch(c, -10, 100)) == 1
    assert [r["status"] for r in rows(svc)] == ["pending"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        database: Any = Database(tmp_path / "lmsp.db")
    else:
        database = PgDatabase(request.getfixturevalue("pg_url"), readers=2)
    yield database
    database.close()


def test_due_deliveries_come_in_turns_between_the_webhooks_owners(db: Any) -> None:
    """One client's 32 webhooks with 8 due deliveries each (older) and another client's
    one (newer): the other's comes in the first turn, and neither a webhook nor a client
    has more than its share in the list; on SQLite and PostgreSQL alike."""

    def owner_of(name: str) -> str:
        made = db.write_sync(lambda c: client_store.add(c, name, ["responses:write"]))
        return str(made[0].id)

    hostile, bystander = owner_of("hostile"), owner_of("bystander")

    def hook_of(client_id: str, n: int) -> str:
        row, _ = db.write_sync(
            lambda c: webhooks.add(c, client_id, f"http://127.0.0.1:9/{n}", ALL, None, False)
        )
        return str(row["id"])

    def deliver(hook_id: str, client_id: str, at: float, n: int) -> None:
        db.write_sync(
            lambda c: c.execute(
                "INSERT INTO webhook_deliveries (event_id, webhook_id, type, response_id,"
                " client_id, created_at, status, next_attempt_at)"
                " VALUES (?, ?, 'response.completed', ?, ?, ?, 'pending', ?)",
                (f"evt_{hook_id}_{n}", hook_id, f"resp_{n}", client_id, at, at),
            )
        )

    now = time.time()
    bad_hooks = [hook_of(hostile, n) for n in range(32)]
    for n in range(8):
        for hook_id in bad_hooks:
            deliver(hook_id, hostile, now - 100 + n, n)
    good_hook = hook_of(bystander, 99)
    deliver(good_hook, bystander, now - 1, 0)
    listed = webhooks.due(db.reader(), now, 4, 16, 256)
    assert listed[0].webhook_id == good_hook or listed[1].webhook_id == good_hook
    assert {d.owner for d in listed[:2]} == {hostile, bystander}
    assert len(listed) == 17  # the hostile client's 16, the bystander's 1
    hostile_hooks = [d.webhook_id for d in listed if d.owner == hostile]
    assert len(set(hostile_hooks)) == 16  # each webhook's oldest before any second
    assert max(hostile_hooks.count(h) for h in hostile_hooks) == 1
    # a webhook's share holds when its client has room
    few = webhooks.due(db.reader(), now, 2, 100, 1000)
    assert max(sum(d.webhook_id == h for d in few) for h in bad_hooks) == 2
    assert len(few) == 32 * 2 + 1
    assert webhooks.due(db.reader(), now - 1000, 4, 16, 256) == []  # nothing due yet
