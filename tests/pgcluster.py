"""A throw-away PostgreSQL cluster for the tests: ``initdb`` + ``pg_ctl`` in a temporary
directory, on a free port, stopped at the end of the session.

PostgreSQL refuses to run as root: as root (CI) the cluster belongs to ``nobody`` and
its commands run through ``runuser``. Without PostgreSQL the tests that need it skip,
saying why, unless ``LMSP_REQUIRE_POSTGRES=1`` (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import free_port

REQUIRED = os.environ.get("LMSP_REQUIRE_POSTGRES") == "1"
MISSING = (
    "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin;"
    " Debian: apt-get install postgresql); set LMSP_REQUIRE_POSTGRES=1 to fail instead"
)


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``PATH`` first, then Debian's layout."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    return None


class Cluster:
    """One PostgreSQL server; :meth:`database` makes a blank database on it."""

    def __init__(self, bins: Path) -> None:
        self.bins = bins
        self.root = Path(tempfile.mkdtemp(prefix="lmsp-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL will not run as root
            self.as_user = ["runuser", "-u", "nobody", "--"]
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, "nobody")
        self.log = self.root / "server.log"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, *args], check=True, capture_output=True, cwd=self.root, timeout=120
        )

    def start(self) -> None:
        self._run(
            str(self.bins / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
            " -c fsync=on -c max_connections=300 -c shared_buffers=64MB"
        )
        self._run(
            str(self.bins / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(self.bins / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def database(self) -> str:
        """The URL of a new, blank database."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def store_reader(settings: Any) -> Any:
    """A connection to the service's database for the tests' own reads: the data
    directory's SQLite file, or the PostgreSQL database (rows by name, ``?``
    placeholders either way)."""
    if settings.database_url:
        from lmsp.store.pg import PgConnection, raw_connect

        return PgConnection(raw_connect(settings.database_url))
    import sqlite3

    conn = sqlite3.connect(str(settings.data_dir / "lmsp.db"), timeout=30)
    conn.row_factory = sqlite3.Row
    return conn
