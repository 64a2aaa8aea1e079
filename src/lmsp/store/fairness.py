"""Where a queued task stands in the fair order the claim follows
(:func:`lmsp.store.tasks.claim_next`, PROTOCOL.md 13).

The claim takes the highest tier first; within it the client with the fewest tasks
running, ties to the client served longest ago (``clients.served``, a counter each claim
advances), and within a client FIFO. :func:`position` plays those claims forward on
the queue as it is — no task arriving, and each claimed task ending before the next
claim, as with one sequence — and answers how many claims it takes to reach the task.
With one sequence that is exact until another task arrives; with several it is an
estimate (a client's running tasks count at claim time, and which ends first cannot be
known).
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque

from lmsp.store.sql import Conn


def position(conn: Conn, task_id: str) -> int | None:
    """The task's place in the queue (1: the next claimed), ``None`` if not queued."""
    rows = conn.execute(
        "SELECT t.id, t.tier, t.client_id, c.served FROM tasks t"
        " JOIN clients c ON c.id = t.client_id WHERE t.status = 'queued' ORDER BY t.seq"
    ).fetchall()
    queues: dict[int, dict[str, deque[tuple[int, str]]]] = defaultdict(lambda: defaultdict(deque))
    served: dict[str, int] = {}
    tier: int | None = None
    for index, row in enumerate(rows):
        queues[int(row["tier"])][row["client_id"]].append((index, row["id"]))
        served[row["client_id"]] = int(row["served"])
        if row["id"] == task_id:
            tier = int(row["tier"])
    if tier is None:
        return None
    # every claim of a higher tier comes first; they move the clients' turns on
    ahead = 0
    counter = max(served.values(), default=0)
    for higher in sorted((t for t in queues if t > tier), reverse=True):
        counter, claimed = _play(queues[higher], served, counter, None)
        ahead += claimed
    counter, claimed = _play(queues[tier], served, counter, task_id)
    return ahead + claimed


def _play(
    by_client: dict[str, deque[tuple[int, str]]],
    served: dict[str, int],
    counter: int,
    stop: str | None,
) -> tuple[int, int]:
    """Claim one tier's tasks in order until ``stop`` (or all); returns the turn counter
    and how many claims were made (``stop``'s included)."""
    # a client's turn: when it was last served, then its oldest task's place in the queue
    heap = [(served[c], queue[0][0], c) for c, queue in by_client.items()]
    heapq.heapify(heap)
    claims = 0
    while heap:
        _, _, client = heapq.heappop(heap)
        _, task = by_client[client].popleft()
        claims += 1
        counter += 1
        served[client] = counter
        if task == stop:
            return counter, claims
        if by_client[client]:
            heapq.heappush(heap, (counter, by_client[client][0][0], client))
    return counter, claims
