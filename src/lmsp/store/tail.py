"""The newest committed events of the tasks this process writes, kept in memory so that
a follower takes what was just committed without reading the database again
(:func:`lmsp.app.follow.task_pages`).

The writer notes each event a transaction appends (:func:`lmsp.store.events.append`,
the same ``(number, type, JSON)`` the log holds) and publishes them once the
transaction has committed, before the tasks' stamps move (:class:`lmsp.store.db.Versions`):
a follower woken by a stamp finds here every event of the commit that moved it. Per task
only a run of consecutive numbers is kept — an event another node appended (PostgreSQL)
breaks the run, which starts again after it — so :meth:`Tail.after` answers with exactly
the committed log from a number on, or ``None``, and the follower reads the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

#: ``(sequence number, type, JSON)``: an event as the log stores it
Row = tuple[int, str, str]

#: events kept per task (a follower that fell further behind reads the database)
KEEP = 64
#: tasks whose runs are kept (the ones written last)
TASKS = 256
#: an event's JSON longer than this is not kept (a final event carrying a long output):
#: the run starts again after it
LARGEST = 64 * 1024


class Tail:
    """Runs of committed events per task, shared by the writer and the followers."""

    def __init__(self, keep: int = KEEP, tasks: int = TASKS) -> None:
        self._keep = keep
        self._tasks = tasks
        self._runs: OrderedDict[str, list[Row]] = OrderedDict()
        self._lock = threading.Lock()

    def publish(self, appended: Iterable[tuple[str, int, str, str]]) -> None:
        """(The writer, once a transaction committed.) ``(task, number, type, JSON)``
        of each event it appended, in the order appended."""
        with self._lock:
            runs = self._runs
            for task_id, seq, kind, data in appended:
                run = runs.get(task_id)
                if len(data) > LARGEST:
                    runs.pop(task_id, None)
                    continue
                if run is None or run[-1][0] != seq - 1:
                    run = runs[task_id] = []
                run.append((seq, kind, data))
                if len(run) > 2 * self._keep:
                    del run[: len(run) - self._keep]
                runs.move_to_end(task_id)
            while len(runs) > self._tasks:
                runs.popitem(last=False)

    def after(self, task_id: str, last: int) -> list[Row] | None:
        """The task's committed events after number ``last``, in order, when this run
        holds them from ``last + 1`` on; ``None`` when it does not (or holds nothing
        newer): read the database then."""
        with self._lock:
            run = self._runs.get(task_id)
            if not run or run[0][0] > last + 1 or run[-1][0] <= last:
                return None
            return run[last + 1 - run[0][0] :]
