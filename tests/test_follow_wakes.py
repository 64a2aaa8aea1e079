"""A commit wakes the followers of the tasks it changed, not every follower (issue 40):
with 64 streams open, each commit used to wake all 64 (and each stream's revocation
watch), though a follower read only when its own task had moved.

Through a real database and its writer: tasks created as a background create creates
them, events appended as the runner appends them, the broker fired by the writer's
commits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lmsp.app import follow
from lmsp.app.broker import Broker
from lmsp.app.root import open_service
from lmsp.config import Settings
from lmsp.store import events
from tests.helpers import queue_background


def test_a_follower_sleeps_through_other_tasks_commits(tmp_path: Path) -> None:
    svc = open_service(Settings(data_dir=tmp_path / "data", enable_test_engine=True))
    try:
        queue_background(svc)
        queue_background(svc)
        (mine, logged), (other, _) = [
            (r[0], int(r[1]))
            for r in svc.db.reader().execute(
                "SELECT id, last_sequence_number FROM tasks ORDER BY seq"
            )
        ]

        async def main() -> tuple[int, list[int]]:
            broker = Broker(asyncio.get_running_loop())
            svc.db.on_commit(broker.notify)
            wakes = 0

            def counting(wait: Any) -> Any:  # a wait that returned because of a commit
                async def counted(*args: Any, **kwargs: Any) -> bool:
                    nonlocal wakes
                    woke = bool(await wait(*args, **kwargs))
                    wakes += woke
                    return woke

                return counted

            for name in ("wait", "wait_change"):
                if hasattr(broker, name):
                    setattr(broker, name, counting(getattr(broker, name)))
            svc.broker = broker
            seen: list[int] = []

            async def follower() -> None:
                async for seq, _kind, _data in follow.task_events(svc, mine, -1):
                    seen.append(seq)

            def add(task_id: str) -> Any:
                return lambda c: events.append(c, task_id, [{"type": "response.in_progress"}])

            following = asyncio.create_task(follower())
            await svc.db.write(add(mine))  # the follower has a stamp to wait on
            await asyncio.sleep(0.2)
            before = wakes
            for _ in range(30):  # 30 commits of another task
                await svc.db.write(add(other))
                await asyncio.sleep(0)
            await asyncio.sleep(0.2)
            woken_by_others = wakes - before
            await svc.db.write(add(mine))
            for _ in range(100):
                if len(seen) >= logged + 2:
                    break
                await asyncio.sleep(0.05)
            following.cancel()
            return woken_by_others, seen

        woken_by_others, seen = asyncio.run(main())
    finally:
        svc.db.close()
    assert woken_by_others == 0, woken_by_others
    # its own commits still reach it, every event once, in order
    assert seen == list(range(seen[0], seen[0] + logged + 2)), seen
