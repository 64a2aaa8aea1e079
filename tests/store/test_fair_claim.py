"""The fair claim order (PROTOCOL.md 13) on SQLite, driven claim by claim: tiers, fewest
running, the client served longest ago, FIFO within a client, ``max_running``, and
queue positions that say the order the claims then follow."""

from __future__ import annotations

import random
from typing import Any

from lmsp.app.service import Service
from lmsp.protocol.request import from_stored
from lmsp.store import clients, limits
from lmsp.store import responses as response_store
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn


def new_client(svc: Service, name: str) -> str:
    return str(svc.db.write_sync(lambda c: clients.add(c, name, ["responses:write"])[0].id))


def queue(svc: Service, client_id: str, tier: str | None = None) -> str:
    request: dict[str, Any] = {"model": "lmsp-test", "input": "x", "background": True}
    if tier is not None:
        request["service_tier"] = tier

    def job(conn: Conn) -> str:
        created = response_store.create(
            conn,
            client_id=client_id,
            request=from_stored(request),
            on_restart="fail",
            max_queue=100,
            key=None,
        )
        return created.task_id

    return str(svc.db.write_sync(job))


def claim(svc: Service) -> str | None:
    row = svc.db.write_sync(lambda c: task_store.claim_next(c))
    return None if row is None else row.id


def positions(svc: Service, ids: list[str]) -> dict[str, int | None]:
    conn = svc.db.reader()
    found: dict[str, int | None] = {}
    for task_id in ids:
        task = task_store.get(conn, task_id)
        assert task is not None
        found[task_id] = task_store.queue_position(conn, task)
    return found


def finish(svc: Service, task_id: str) -> None:
    svc.db.write_sync(lambda c: task_store.cancel(c, task_id))
    svc.db.write_sync(lambda c: task_store.finish_cancel(c, task_id))


def claim_one_by_one(svc: Service, count: int) -> list[str]:
    """One sequence: each claimed task ends before the next claim."""
    order = []
    for _ in range(count):
        claimed = claim(svc)
        assert claimed is not None
        order.append(claimed)
        finish(svc, claimed)
    return order


def test_a_flood_does_not_starve_a_single_request_and_positions_tell_the_order(
    svc: Service,
) -> None:
    heavy, light = new_client(svc, "heavy"), new_client(svc, "light")
    floods = [queue(svc, heavy) for _ in range(6)]
    single = queue(svc, light)
    shown = positions(svc, [*floods, single])
    # rounds: heavy's first, light's only, then heavy's others in order
    expected = [floods[0], single, *floods[1:]]
    assert [shown[t] for t in expected] == list(range(1, 8))
    assert claim_one_by_one(svc, 7) == expected
    assert claim(svc) is None


def test_the_client_with_fewest_running_goes_first(svc: Service) -> None:
    a, b = new_client(svc, "a"), new_client(svc, "b")
    a_tasks = [queue(svc, a) for _ in range(4)]
    b_task = queue(svc, b)
    assert claim(svc) == a_tasks[0]  # both idle, a's task is the oldest
    # a runs one, b none: b's goes next, though a's are older
    assert positions(svc, [b_task])[b_task] == 1
    assert claim(svc) == b_task
    assert claim(svc) == a_tasks[1]


def newcomer(svc: Service) -> str | None:
    row = svc.db.write_sync(lambda c: task_store.claim_next(c, newcomer=True))
    return None if row is None else row.id


def test_the_reserved_sequence_takes_only_a_client_with_nothing_running(svc: Service) -> None:
    heavy, light, patient = (
        new_client(svc, "heavy"),
        new_client(svc, "light"),
        new_client(svc, "patient"),
    )
    flood = [queue(svc, heavy) for _ in range(3)]
    assert newcomer(svc) == flood[0]  # nothing runs yet: heavy's is a newcomer's too
    assert newcomer(svc) is None  # heavy runs one now: its others wait for a sequence
    waiting = queue(svc, patient, "flex")
    assert newcomer(svc) is None  # flex waits for a sequence of its own
    single = queue(svc, light)
    urgent = queue(svc, heavy, "priority")
    assert newcomer(svc) is None  # heavy's priority task waits: it goes first
    assert claim(svc) == urgent
    assert newcomer(svc) == single
    finish(svc, urgent)
    finish(svc, flood[0])
    finish(svc, single)
    assert newcomer(svc) == flood[1]  # nobody runs again
    # the regular claims keep their order: the default tier first, then flex
    assert claim(svc) == flood[2]
    assert claim(svc) == waiting


def test_tiers_priority_then_default_then_flex(svc: Service) -> None:
    a, b = new_client(svc, "a"), new_client(svc, "b")
    flex = queue(svc, a, "flex")
    default = queue(svc, b, "default")
    auto = queue(svc, a, "auto")
    urgent = queue(svc, b, "priority")
    shown = positions(svc, [flex, default, auto, urgent])
    # b is served for its priority task first: a's turn comes first among the default ones
    assert shown == {urgent: 1, auto: 2, default: 3, flex: 4}
    assert claim_one_by_one(svc, 4) == [urgent, auto, default, flex]


def test_max_running_holds_a_client_back_at_claim_time(svc: Service) -> None:
    a, b = new_client(svc, "a"), new_client(svc, "b")
    svc.db.write_sync(lambda c: limits.update(c, a, {"max_running": 1}))
    a_tasks = [queue(svc, a) for _ in range(3)]
    b_task = queue(svc, b)
    assert claim(svc) == a_tasks[0]
    assert claim(svc) == b_task  # a is at its max_running
    assert claim(svc) is None  # only a's are left, and a still runs one
    finish(svc, a_tasks[0])
    assert claim(svc) == a_tasks[1]


def test_default_limits_are_read_from_the_environment() -> None:
    from lmsp.config import from_env

    got = from_env({"LMSP_DEFAULT_LIMITS": "max_queued=50, tokens_per_day=1000000"})
    assert dict(got.default_limits) == {"max_queued": 50, "tokens_per_day": 1000000}
    for bad in ("max_queued=0", "max_queued=x", "per_hour=5"):
        try:
            from_env({"LMSP_DEFAULT_LIMITS": bad})
        except ValueError as exc:
            assert "LMSP_DEFAULT_LIMITS" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_the_skip_scan_picks_what_ordering_every_queued_task_picks(svc: Service) -> None:
    """SQLite's claim reads each (tier, client)'s oldest queued task off the index
    instead of ordering every queued task: through a long random run of queues, claims
    (regular and reserved), ends and limits, both forms pick the same task each time
    (a no-op ``models`` condition makes the store take the form that orders them all)."""
    rng = random.Random(7)
    ids = [new_client(svc, f"c{i}") for i in range(5)]
    tiers = [None, "priority", "default", "flex", "auto"]
    running: list[str] = []
    compared = queued = 0
    for _ in range(400):
        roll = rng.random()
        if roll < 0.45 and queued < 90:  # the helper's queue holds 100
            queue(svc, rng.choice(ids), rng.choice(tiers))
            queued += 1
        elif roll < 0.6 and running:
            finish(svc, running.pop(rng.randrange(len(running))))
        elif roll < 0.65:
            change = {"max_running": rng.choice([None, 1, 2])}
            who = rng.choice(ids)
            svc.db.write_sync(lambda c, who=who, change=change: limits.update(c, who, change))
        else:
            reserved = rng.random() < 0.3
            conn = svc.db.reader()
            turn = task_store._NEWCOMER if reserved else ""
            picks = [
                conn.execute(task_store._next_queued(conn, models, turn)).fetchone()
                for models in ("", " AND 1 = 1")
            ]
            assert picks[0] == picks[1]
            compared += picks[0] is not None
            row = svc.db.write_sync(lambda c, r=reserved: task_store.claim_next(c, newcomer=r))
            assert (row and row.id) == (picks[0] and picks[0][0])
            if row is not None:
                running.append(row.id)
                queued -= 1
    assert compared > 50
