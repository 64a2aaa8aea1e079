"""PostgreSQL readers come from psycopg's pool: bounded, one to a reading thread while it
lives, given back when the thread ends and replaced when broken."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from lmsp.store.pg import PgDatabase


@pytest.fixture
def db(pg_url: str) -> Iterator[PgDatabase]:
    database = PgDatabase(pg_url, readers=3)
    yield database
    database.close()


def _read_in_a_thread(db: PgDatabase) -> int:
    seen: list[int] = []

    def read() -> None:
        conn = db.reader()
        assert conn is db.reader()  # the same connection for the thread's life
        seen.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return seen[0]


def test_a_thread_that_ends_gives_its_connection_back(db: PgDatabase) -> None:
    # ten short-lived reading threads on a pool of three: none waits, none leaks
    pids = {_read_in_a_thread(db) for _ in range(10)}
    assert 1 <= len(pids) <= 3
    stats = db._pool.get_stats()
    assert stats["pool_size"] <= 3 and stats.get("requests_waiting", 0) == 0


def test_a_broken_reader_is_replaced(db: PgDatabase) -> None:
    conn = db.reader()
    first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    conn.raw.close()  # as a dropped connection would be
    again = db.reader()
    assert again is not conn
    assert again.execute("SELECT pg_backend_pid()").fetchone()[0] != first


def test_the_readers_are_bounded(db: PgDatabase) -> None:
    held = threading.Barrier(4)
    done = threading.Event()
    pids: list[int] = []

    def hold() -> None:
        pids.append(db.reader().execute("SELECT pg_backend_pid()").fetchone()[0])
        held.wait()
        done.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    held.wait(10)
    assert len(set(pids)) == 3 and db._pool.get_stats()["pool_size"] == 3
    done.set()
    for thread in threads:
        thread.join()
    # the three came back: a fourth thread reads at once
    assert _read_in_a_thread(db) in pids
