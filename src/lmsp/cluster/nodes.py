"""A node's membership of a shared database: its lease, renewed, and the rescuer.

Every node runs one :class:`Membership` thread. It renews the node's lease every third
of ``LMSP_LEASE_TTL``; a renewal refused (another node found the lease run out and
marked this node lost) means the tasks in flight are no longer this node's: the runner
drops them without a write (its writes are fenced anyway) and the node joins again
under a new epoch. Each tick it is also the **rescuer**: nodes whose lease ran out are
marked lost and their unfinished tasks go through the recovery table (chapter 11.3),
one transaction each, with the error code ``node_lost``: ``fail`` → ``failed``,
``retry`` → ``queued``, ``resume`` → left ``running`` for the next node to claim and
continue from its snapshot, ``cancelling`` → ``cancelled``. Every node rescues; the
guarded moves make a second rescuer of the same task a no-op.
"""

from __future__ import annotations

import logging
import threading
import time

from lmsp.runner.recovery import Report, recover_task
from lmsp.runner.runner import Runner
from lmsp.store import nodes
from lmsp.store.db import Database
from lmsp.store.sql import Conn

log = logging.getLogger(__name__)

NODE_LOST_MESSAGE = (
    "The node running this task stopped answering (its lease ran out) while the task was"
    " unfinished."
)
#: the longest between two rescue scans (a lease that ran out is acted on this soon)
RESCUE_EVERY = 1.0


class Membership:
    """This node's lease and rescuer on a shared database."""

    def __init__(self, db: Database, node_id: str, address: str, ttl: float) -> None:
        self.db = db
        self.runner: Runner | None = None
        self.node_id = node_id
        self.address = address
        self.ttl = ttl
        self.node: nodes.Node | None = None
        self.rescued = 0  # tasks this node rescued (for tests and the log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self) -> nodes.Node:
        """Register under a new epoch; the runner claims under it from now on."""
        node = self.db.write_sync(lambda c: nodes.join(c, self.node_id, self.address, self.ttl))
        self.node = node
        if self.runner is not None:
            self.runner.node = node
        log.info(
            "node %s joined (epoch %d, lease %.0fs)",
            node.id,
            node.epoch,
            self.ttl,
            extra={"event": "node.joined", "node": node.id},
        )
        return node

    def attach(self, runner: Runner) -> None:
        """The runner that claims under this node's lease (and drops what it loses)."""
        self.runner = runner
        runner.node = self.node

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lmsp-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and leave: the lease ends now, so other nodes take over at once
        whatever the runner left unfinished."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        node = self.node
        if node is not None:
            try:
                self.db.write_sync(lambda c: nodes.leave(c, node))
            except Exception as exc:  # the database may be gone: the lease runs out then
                log.warning("leaving the cluster failed: %s", exc)

    def _loop(self) -> None:
        renew_every = self.ttl / 3
        tick = min(RESCUE_EVERY, renew_every)
        next_renew = time.monotonic() + renew_every
        while not self._stop.wait(tick) and not self.db.closed:
            try:
                if time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + renew_every
                    self.renew()
                self.rescue()
            except Exception as exc:  # the database is unreachable: try again next tick
                log.warning("lease upkeep failed: %s", exc)

    def renew(self) -> bool:
        node = self.node
        assert node is not None
        if self.db.write_sync(lambda c: nodes.renew(c, node, self.ttl)):
            return True
        log.error(
            "node %s lost its lease (epoch %d): dropping its tasks in flight and joining again",
            node.id,
            node.epoch,
            extra={"event": "node.lease_lost", "node": node.id},
        )
        if self.runner is not None:
            self.runner.lease_lost()
        self.join()
        return False

    def rescue(self) -> Report:
        """Mark nodes whose lease ran out lost, and recover their tasks."""
        report = Report()
        lost = self.db.write_sync(lambda c: nodes.mark_lost(c, self.node_id))
        for node_id in lost:
            log.warning(
                "node %s lost (its lease ran out): recovering its tasks",
                node_id,
                extra={"event": "node.lost", "node": node_id},
            )
        for task_id, holder in nodes.orphaned(self.db.reader(), self.node_id):

            def job(conn: Conn, task_id: str = task_id, holder: str = holder) -> None:
                if nodes.held_by(conn, task_id, holder):  # not rescued by another meanwhile
                    recover_task(conn, task_id, report, "node_lost", NODE_LOST_MESSAGE)

            self.db.write_sync(job)
        if report.outcomes:
            self.rescued += len(report.outcomes)
            if self.runner is not None:
                self.runner.notify()
            log.warning(
                "rescued %d task(s) of lost nodes: %d failed, %d cancelled, %d requeued,"
                " %d to resume",
                len(report.outcomes),
                len(report.failed),
                len(report.cancelled),
                len(report.requeued),
                len(report.resumed),
                extra={"event": "node.rescued"},
            )
        return report
