"""Writes retried while the disk is full: a terminal write of a task or a pull must
land once the storage takes writes again (or be left, at shutdown, for startup
recovery); delays that double; and the small real write that tells whether the storage
takes writes again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from lmsp.store import service as config_store
from lmsp.store.db import Database
from lmsp.store.health import is_storage_error
from lmsp.store.sql import Conn

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_DELAY = 0.05
MAX_DELAY = 5.0


class Backoff:
    """Delays that double from ``first`` up to ``most`` seconds."""

    def __init__(self, first: float = FIRST_DELAY, most: float = MAX_DELAY) -> None:
        self.first = first
        self.most = most
        self.current = first

    def next(self) -> float:
        delay = self.current
        self.current = min(self.current * 2, self.most)
        return delay

    def reset(self) -> None:
        self.current = self.first


def write_until_done(
    db: Database, job: Callable[[Conn], T], stop: threading.Event, what: str
) -> tuple[bool, T | None]:
    """Run ``job`` through the writer, retrying it while the disk is full.

    Returns ``(True, result)`` once it committed, or ``(False, None)`` if ``stop`` was
    set while it waited (shutdown: the task stays as it is, for startup recovery).
    Any other error is raised at once.
    """
    backoff = Backoff()
    retrying = False
    try:
        while True:
            try:
                return True, db.write_sync(job)
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
            if not retrying:
                retrying = True
                db.health.retry_started()
                log.warning("%s: the disk is full; retrying until it commits", what)
            if stop.wait(backoff.next()):
                return False, None
    finally:
        if retrying:
            db.health.retry_ended()


def probe(conn: Conn) -> None:
    """A small real write: does the storage take writes again?"""
    config_store.put(conn, "storage_probe", str(int(time.time())))
