"""The writer's tail of each task's log (store/tail.py): what a follower takes instead of
reading the database is exactly the committed log — never an event of a job that was
rolled back, never a run with a hole (another node's event), nothing before its commit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lmsp.app import follow
from lmsp.app.broker import Broker
from lmsp.app.root import open_service
from lmsp.config import Settings
from lmsp.store import events
from lmsp.store.tail import LARGEST, Tail
from tests.helpers import queue_background


def rows(task: str, first: int, last: int) -> list[tuple[str, int, str, str]]:
    return [(task, n, "t", f'{{"n":{n}}}') for n in range(first, last + 1)]


def test_a_run_gives_the_events_after_a_number_or_nothing() -> None:
    tail = Tail(keep=4)
    tail.publish(rows("a", 0, 2))
    assert tail.after("a", -1) == [(0, "t", '{"n":0}'), (1, "t", '{"n":1}'), (2, "t", '{"n":2}')]
    assert tail.after("a", 1) == [(2, "t", '{"n":2}')]
    assert tail.after("a", 2) is None  # nothing newer: the database says whether it is over
    assert tail.after("b", -1) is None
    tail.publish(rows("a", 3, 12))  # kept: the last 4 to 8
    assert tail.after("a", 2) is None  # no longer reaches back to 3
    held = tail.after("a", 10)
    assert held is not None and [seq for seq, _, _ in held] == [11, 12]


def test_an_event_another_node_appended_starts_the_run_again() -> None:
    tail = Tail()
    tail.publish(rows("a", 0, 4))
    tail.publish(rows("a", 6, 7))  # 5 was another node's
    assert tail.after("a", 4) is None  # 5 is not here: read the database
    held = tail.after("a", 5)
    assert held is not None and [seq for seq, _, _ in held] == [6, 7]


def test_a_large_event_is_not_kept_and_the_run_starts_after_it() -> None:
    tail = Tail()
    tail.publish(rows("a", 0, 1))
    tail.publish([("a", 2, "t", "x" * (LARGEST + 1)), *rows("a", 3, 4)])
    assert tail.after("a", 1) is None
    held = tail.after("a", 2)
    assert held is not None and [seq for seq, _, _ in held] == [3, 4]


def test_only_the_tasks_written_last_are_kept() -> None:
    tail = Tail(tasks=2)
    for task in ("a", "b", "c"):
        tail.publish(rows(task, 0, 0))
    assert tail.after("a", -1) is None
    assert tail.after("b", -1) is not None and tail.after("c", -1) is not None


@pytest.fixture
def service(tmp_path: Path) -> Any:
    svc = open_service(Settings(data_dir=tmp_path / "data", enable_test_engine=True))
    yield svc
    svc.db.close()


def _delta(text: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": text}


def test_the_tail_is_the_committed_log_and_never_a_rolled_back_job(service: Any) -> None:
    svc = service
    task = queue_background(svc)

    def doomed(conn: Any) -> None:
        events.append(conn, task, [_delta("never")])
        raise RuntimeError("this job fails: its savepoint is rolled back")

    with pytest.raises(RuntimeError):
        svc.db.write_sync(doomed)
    for word in ("one", "two", "three"):
        svc.db.write_sync(lambda conn, w=word: events.append(conn, task, [_delta(w), _delta(w)]))
    logged = events.after(svc.db.reader(), task, -1)
    assert "never" not in "".join(data for _, _, data in logged)
    for last in range(-1, len(logged) - 1):
        assert svc.db.tail.after(task, last) == logged[last + 1 :]


def test_a_follower_takes_the_commits_from_the_tail_and_the_rest_from_the_database(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower woken by the commits of a task this process writes reads the database
    only for what the tail does not hold (here: the log as it was before, written by an
    earlier process as far as this one's tail knows)."""
    svc = service
    task = queue_background(svc)
    svc.db.tail = Tail()  # the create's events are not in it
    reads: list[int] = []
    page = follow._page

    def counted(core: Any, task_id: str, last: int) -> Any:
        reads.append(last)
        return page(core, task_id, last)

    monkeypatch.setattr(follow, "_page", counted)

    async def main() -> list[int]:
        broker = Broker(asyncio.get_running_loop())
        svc.db.on_commit(broker.notify)
        svc.broker = broker
        seen: list[int] = []

        async def follower() -> None:
            async for seq, _kind, _data in follow.task_events(svc, task, -1):
                seen.append(seq)

        following = asyncio.create_task(follower())
        await asyncio.sleep(0.2)
        for n in range(20):
            await svc.db.write(lambda conn, n=n: events.append(conn, task, [_delta(str(n))]))
            await asyncio.sleep(0.01)
        await svc.db.write(lambda conn: events.append(conn, task, [{"type": "response.completed"}]))
        await asyncio.wait_for(following, 10)
        return seen

    seen = asyncio.run(main())
    logged = events.after(svc.db.reader(), task, -1, 1000)
    assert seen == [seq for seq, _, _ in logged] == list(range(len(logged)))
    assert reads and reads[0] == -1  # the log before it came: from the database
    assert len(reads) <= 2, reads  # the 21 commits after: from the tail
