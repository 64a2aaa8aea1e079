"""Which store a service opens: PostgreSQL when ``LMSP_DATABASE_URL`` names one, else the
data directory's embedded SQLite database (the default; one node)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmsp.config import Settings
from lmsp.store.db import Database

if TYPE_CHECKING:
    from lmsp.datadir import DataDirLock


def open_database(settings: Settings, lock: DataDirLock | None = None) -> Database:
    """Open (and migrate) the service's database."""
    if settings.database_url:
        from lmsp.store.pg import PgDatabase  # psycopg is loaded only when it is used

        idle = min(5.0, settings.lease_ttl / 3)
        return PgDatabase(settings.database_url, lock, idle_in_transaction=idle)
    return Database(settings.db_path, lock=lock)
