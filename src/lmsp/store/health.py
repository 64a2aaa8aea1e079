"""Whether the data directory's storage takes writes: ``ok`` or ``degraded``.

The writer reports every transaction's outcome here. A write refused for lack of space
(``SQLITE_FULL``, ``ENOSPC``) makes the storage ``degraded``; the next transaction that
changes something and commits makes it ``ok`` again. The runner takes no new task while
the storage is degraded, and ``/healthz`` reports it.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_MESSAGE = "database or disk is full"


def is_storage_error(exc: BaseException) -> bool:
    """A failure that means "no space left to write", whatever layer raised it."""
    if isinstance(exc, LmspError):
        return exc.code == "insufficient_storage"
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or FULL_MESSAGE in str(exc)
    if getattr(exc, "sqlstate", None) in ("53100", "53000"):  # PostgreSQL: disk full
        return True
    if isinstance(exc, OSError):
        return exc.errno in NO_SPACE_ERRNOS
    return False


def insufficient_storage(detail: str = "") -> LmspError:
    message = "The service's disk is full: nothing was written. Free some space and retry."
    return LmspError("insufficient_storage", message + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class HealthReport:
    status: str  # "ok" or "degraded"
    reason: str | None
    since: float | None
    failed_writes: int
    retrying: int

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.status != "ok":
            out["reason"] = self.reason
            out["since"] = None if self.since is None else int(self.since)
        out["failed_writes"] = self.failed_writes
        out["retrying_writes"] = self.retrying
        return out


class StorageHealth:
    """Thread-safe; written by the writer thread, read by anyone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._reason: str | None = None
        self.failed_writes = 0
        self.retrying = 0  # writes the runner is retrying until they commit

    @property
    def ok(self) -> bool:
        return self._since is None

    def failed(self, reason: str = "insufficient_storage") -> None:
        with self._lock:
            self.failed_writes += 1
            if self._since is None:
                self._since = time.time()
                self._reason = reason

    def succeeded(self) -> None:
        if self._since is None:
            return
        with self._lock:
            self._since = None
            self._reason = None

    def retry_started(self) -> None:
        with self._lock:
            self.retrying += 1

    def retry_ended(self) -> None:
        with self._lock:
            self.retrying -= 1

    def report(self) -> HealthReport:
        with self._lock:
            status = "ok" if self._since is None else "degraded"
            return HealthReport(
                status, self._reason, self._since, self.failed_writes, self.retrying
            )
