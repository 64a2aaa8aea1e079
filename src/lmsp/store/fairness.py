"""Where a queued task stands in the fair order the claim follows
(:func:`lmsp.store.tasks.claim_next`, PROTOCOL.md 13).

The claim takes the highest tier first; within it the client with the fewest tasks
running, ties to the client served longest ago (``clients.served``, a counter each claim
advances), and within a client FIFO. With one sequence nothing else runs when a claim
is made, so within a tier the clients take turns in a fixed cycle — ordered by when each
was last served (a client whose tasks of a higher tier are still queued is served
after those, so it comes last) — and a client's ``k``-th task runs in round ``k``. The
position of a task is then: every queued task of a higher tier, plus the client's own
earlier tasks, plus from every other client of its tier ``min(its queued, k - 1)``
tasks and one more if it has a ``k``-th and its turn comes first.

That is exact with one sequence until another task arrives; with several it is an
estimate (which running task ends first cannot be known). It costs one aggregate over
the tier's queued tasks (by client) and a loop over the clients, not the tasks.
"""

from __future__ import annotations

from typing import Any

from lmsp.store.sql import Conn


def position(conn: Conn, task_id: str) -> int | None:
    """The task's place in the queue (1: the next claimed), ``None`` if not queued."""
    mine = conn.execute(
        "SELECT tier, client_id, seq FROM tasks WHERE id = ? AND status = 'queued'", (task_id,)
    ).fetchone()
    if mine is None:
        return None
    tier, client, seq = int(mine["tier"]), mine["client_id"], int(mine["seq"])
    higher = int(
        conn.execute(
            "SELECT count(*) FROM tasks WHERE status = 'queued' AND tier > ?", (tier,)
        ).fetchone()[0]
    )
    earlier = int(
        conn.execute(
            "SELECT count(*) FROM tasks WHERE status = 'queued' AND tier = ? AND client_id = ?"
            " AND seq < ?",
            (tier, client, seq),
        ).fetchone()[0]
    )
    # each client's last queued task of a higher tier (only those tasks are read)
    later = {
        row[0]: int(row[1])
        for row in conn.execute(
            "SELECT client_id, max(seq) FROM tasks WHERE status = 'queued' AND tier > ?"
            " GROUP BY client_id",
            (tier,),
        )
    }
    turns: dict[str, tuple[int, tuple[Any, ...]]] = {}
    for row in conn.execute(
        "SELECT g.client_id, g.n, g.head, c.served FROM (SELECT client_id, count(*) AS n,"
        " min(seq) AS head FROM tasks WHERE status = 'queued' AND tier = ? GROUP BY client_id) g"
        " JOIN clients c ON c.id = g.client_id",
        (tier,),
    ):
        other = row["client_id"]
        if other not in later:  # its turn: when it was last served, its oldest task
            turn: tuple[Any, ...] = (0, int(row["served"]), int(row["head"]))
        else:  # served for its higher-tier tasks first: after every other client
            turn = (1, later[other], int(row["head"]))
        turns[other] = (int(row["n"]), turn)
    if client not in turns:  # claimed meanwhile: these reads are not one snapshot
        return None
    _, my_turn = turns[client]
    ahead = higher + earlier
    for other, (queued, turn) in turns.items():
        if other == client:
            continue
        ahead += min(queued, earlier)
        if queued > earlier and turn < my_turn:
            ahead += 1
    return ahead + 1
