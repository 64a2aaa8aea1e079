"""Nodes sharing one database: leases, fencing and the tasks a lost node leaves.

A node joins with a new **epoch** (one more than its id had before) and a lease that it
renews; every time is the database's clock (:func:`lmsp.store.sql.clock_sql`), never a
node's. A task a node claims records ``(node_id, lease_epoch)``; every write the runner
makes for it first passes :func:`fence` in the same transaction: the task still belongs
to this node under this epoch, and the node's lease is live. A node paused past its
lease (or cut off) therefore never writes for a task again, whatever it had in flight:
by then the task was rescued (its row changed owner or state) or the lease check fails.

A lease that ran out marks its node ``lost``; any node's rescuer then applies the
recovery table (chapter 11.3) to the lost node's tasks, one transaction each, with the
error code ``node_lost`` (:mod:`lmsp.cluster.nodes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lmsp.errors import LmspError
from lmsp.protocol.records import TaskRecord
from lmsp.protocol.states import UNFINISHED_SQL
from lmsp.store.sql import Conn, Row, clock_sql


@dataclass(frozen=True)
class Node:
    """This node's identity under its current lease."""

    id: str
    epoch: int


class LeaseLost(LmspError):
    """A write for a task this node no longer holds (its lease ran out, another node
    took the task over): nothing of it was written."""

    def __init__(self, task_id: str) -> None:
        super().__init__("node_lost", f"This node no longer holds task {task_id}.")
        self.task_id = task_id


def join(conn: Conn, node_id: str, address: str, ttl: float) -> Node:
    """Register this node (again) under a new epoch with a fresh lease."""
    now = clock_sql(conn)
    row = conn.execute(
        "INSERT INTO nodes (id, epoch, address, started_at, heartbeat_at, lease_expires_at,"
        f" status, clock_skew) VALUES (?, 1, ?, {now}, {now}, {now} + ?, 'up', {now} - ?)"
        " ON CONFLICT (id) DO UPDATE SET epoch = nodes.epoch + 1, address = excluded.address,"
        " started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,"
        " lease_expires_at = excluded.lease_expires_at, status = 'up',"
        " clock_skew = excluded.clock_skew RETURNING epoch",
        (node_id, address, ttl, time.time()),
    ).fetchone()
    return Node(node_id, int(row[0]))


def renew(conn: Conn, node: Node, ttl: float) -> bool:
    """Extend this node's lease; ``False`` when it is lost already (another node marked
    it so: its tasks were, or are being, rescued). Records the node's clock skew (the
    database's clock minus this machine's) as it goes."""
    now = clock_sql(conn)
    cur = conn.execute(
        f"UPDATE nodes SET heartbeat_at = {now}, lease_expires_at = {now} + ?,"
        f" clock_skew = {now} - ?"
        f" WHERE id = ? AND epoch = ? AND status = 'up' AND lease_expires_at > {now}",
        (ttl, time.time(), node.id, node.epoch),
    )
    return cur.rowcount == 1


def leave(conn: Conn, node: Node) -> None:
    """A node stopping on purpose: its lease ends now, so another node takes its tasks
    over at once (a node restarting with the same id recovers them itself first)."""
    now = clock_sql(conn)
    conn.execute(
        f"UPDATE nodes SET status = 'left', lease_expires_at = {now}"
        " WHERE id = ? AND epoch = ? AND status = 'up'",
        (node.id, node.epoch),
    )


def fence(conn: Conn, task_id: str, node: Node) -> None:
    """Raise :class:`LeaseLost` unless ``node`` holds ``task_id`` under a live lease.

    Runs first in a runner's write transaction; on PostgreSQL it locks the task's row
    until the commit, so no rescue can move the task in between."""
    now = clock_sql(conn)
    lock = " FOR UPDATE OF t" if conn.for_update else ""
    row = conn.execute(
        "SELECT 1 FROM tasks t JOIN nodes n ON n.id = t.node_id"
        " WHERE t.id = ? AND t.node_id = ? AND t.lease_epoch = ? AND n.epoch = ?"
        f" AND n.status = 'up' AND n.lease_expires_at > {now}{lock}",
        (task_id, node.id, node.epoch, node.epoch),
    ).fetchone()
    if row is None:
        raise LeaseLost(task_id)


def mark_lost(conn: Conn, exclude: str) -> list[str]:
    """Mark every node whose lease ran out while it was ``up`` ``lost`` (not
    ``exclude``, this node); the ids marked now. A node that stopped on purpose stays
    ``left`` (its tasks are rescued all the same: :func:`orphaned`)."""
    now = clock_sql(conn)
    return [
        str(row[0])
        for row in conn.execute(
            "UPDATE nodes SET status = 'lost'"
            f" WHERE status = 'up' AND lease_expires_at <= {now} AND id <> ?"
            " RETURNING id",
            (exclude,),
        )
    ]


def orphaned(conn: Conn, exclude: str) -> list[tuple[str, str]]:
    """``(task id, node id)`` of unfinished tasks held by a lost node or one that left,
    oldest first."""
    return [
        (str(row[0]), str(row[1]))
        for row in conn.execute(
            "SELECT t.id, t.node_id FROM tasks t JOIN nodes n ON n.id = t.node_id"
            f" WHERE n.status IN ('lost', 'left') AND n.id <> ? AND t.status IN ({UNFINISHED_SQL})"
            " ORDER BY t.seq",
            (exclude,),
        )
    ]


def held_by(conn: Conn, task_id: str, node_id: str) -> bool:
    """Is ``task_id`` still held by ``node_id`` (in the caller's transaction, locked)?"""
    row = conn.execute(
        f"SELECT 1 FROM tasks WHERE id = ? AND node_id = ?{conn.for_update}", (task_id, node_id)
    ).fetchone()
    return row is not None


def own_unfinished(conn: Conn, node_id: str) -> list[TaskRecord]:
    """The unfinished tasks this node id held (a node restarting recovers them)."""
    return [
        TaskRecord.of(row)
        for row in conn.execute(
            f"SELECT * FROM tasks WHERE node_id = ? AND status IN ({UNFINISHED_SQL}) ORDER BY seq",
            (node_id,),
        )
    ]


def others_alive(conn: Conn, node_id: str) -> bool:
    """Does a node other than ``node_id`` hold a live lease?"""
    now = clock_sql(conn)
    row = conn.execute(
        f"SELECT 1 FROM nodes WHERE id <> ? AND status = 'up' AND lease_expires_at > {now}",
        (node_id,),
    ).fetchone()
    return row is not None


def all_nodes(conn: Conn) -> list[Row]:
    """Every node that ever joined, with its lease's seconds left (database clock), its
    clock skew at its last renewal and how many unfinished tasks it holds."""
    now = clock_sql(conn)
    return list(
        conn.execute(
            "SELECT n.id, n.epoch, n.address, n.status, n.started_at, n.heartbeat_at,"
            " n.clock_skew,"
            f" n.lease_expires_at - {now} AS lease_left,"
            " (SELECT count(*) FROM tasks t WHERE t.node_id = n.id"
            f"  AND t.status IN ({UNFINISHED_SQL})) AS tasks"
            " FROM nodes n ORDER BY n.id"
        )
    )


def held_tasks(conn: Conn, limit: int = 50) -> dict[str, list[Row]]:
    """Each node's unfinished tasks (id, status, client), oldest first, at most
    ``limit`` a node."""
    held: dict[str, list[Row]] = {}
    for row in conn.execute(
        "SELECT node_id, id, status, client_id FROM tasks"
        f" WHERE node_id IS NOT NULL AND status IN ({UNFINISHED_SQL}) ORDER BY seq"
    ):
        mine = held.setdefault(str(row["node_id"]), [])
        if len(mine) < limit:
            mine.append(row)
    return held


def clock_skew(conn: Conn, local: float) -> float:
    """The database's clock minus ``local`` (this machine's, read just before)."""
    row = conn.execute(f"SELECT {clock_sql(conn)}").fetchone()
    return float(row[0]) - local
