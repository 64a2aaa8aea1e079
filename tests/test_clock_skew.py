"""A node whose clock is wrong cannot delete the cluster's data (issue 30, item 2).

Two real ``lmsp serve`` nodes on a throw-away PostgreSQL database; the second runs under
libfaketime (Debian's ``faketime``), its clock eight days ahead, with retention sweeping
every half second. Before the fix its first pass deleted every finished response in the
cluster (7-day retention, judged by its own clock) and their idempotency keys, so a
retried key made a second response. Now every age is judged by the database's clock:
it sweeps what is old by that clock only, the other node's fresh response and key stay,
what it finishes itself is stamped by the database's clock, and ``lmsp doctor`` on it
fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server
from tests.pgcluster import REQUIRED, Cluster
from tests.test_scale_out import reader

pytestmark = pytest.mark.slow

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
MISSING = (
    "libfaketime is not installed (Debian: apt-get install faketime);"
    " set LMSP_REQUIRE_POSTGRES=1 to fail instead"
)
DAY = 86400
# (its monotonic clock is shifted too: with FAKETIME_DONT_FAKE_MONOTONIC, Python's
# time.sleep fails with EINVAL under libfaketime 0.9.10)
AHEAD = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": "+8d"}


def faketime_env() -> dict[str, str]:
    if not LIBFAKETIME.is_file():
        if REQUIRED:
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return dict(AHEAD)


def node(tmp_path: Path, url: str, name: str, ttl: str = "3s", **env: str) -> Server:
    data_dir = tmp_path / name
    data_dir.mkdir()
    base = {
        "LMSP_DATABASE_URL": url,
        "LMSP_NODE_ID": name,
        "LMSP_LEASE_TTL": ttl,
        "LMSP_TEST_ENGINE_DELAY": "0.01",
    }
    return Server(data_dir, env={**base, **env})


def create(http: httpx.Client, key: str) -> dict[str, Any]:
    body = {"model": "lmsp-test", "input": f"clock {key}", "max_output_tokens": 8}
    answer = http.post("/v1/responses", json=body, headers={"Idempotency-Key": key})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] in ("completed", "incomplete"), answer.text
    return dict(answer.json())


def scalar(url: str, sql: str, *args: Any) -> Any:
    conn = reader(url)
    try:
        row = conn.execute(sql, args).fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def test_a_node_eight_days_ahead_deletes_nothing_fresh(tmp_path: Path, pg_cluster: Cluster) -> None:
    ahead = faketime_env()
    url = pg_cluster.database()
    # leases long enough that a busy machine never loses one (a lost lease is not the
    # subject here; the clock is)
    first = node(tmp_path, url, "a", ttl="15s").start()
    skewed = node(tmp_path, url, "b", ttl="15s", LMSP_GC_INTERVAL="0.5s", **ahead)
    try:
        token = first.token
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=first.url, headers=headers, timeout=60) as http:
            fresh = create(http, "fresh-key")
            old = create(http, "old-key")
        # the control: a response that finished nine days ago by the database's clock
        conn = reader(url)
        try:
            conn.execute(
                "UPDATE tasks SET finished_at = finished_at - ? WHERE response_id = ?",
                (9 * DAY, old["id"]),
            )
        finally:
            conn.close()

        skewed.start()
        with httpx.Client(base_url=skewed.url, headers=headers, timeout=60) as http:
            deadline = time.monotonic() + 60
            while scalar(url, "SELECT count(*) FROM responses WHERE id = ?", old["id"]):
                assert time.monotonic() < deadline, "the skewed node never swept"
                time.sleep(0.2)
            # it swept: what is old by the database's clock, and nothing else
            assert http.get(f"/v1/responses/{fresh['id']}").status_code == 200
            assert scalar(url, "SELECT count(*) FROM idempotency_keys WHERE key = 'fresh-key'")
            # the retried key replays the first response: no second one
            again = create(http, "fresh-key")
            assert again["id"] == fresh["id"]
            # what the skewed node finishes is stamped by the database's clock
            own = create(http, "own-key")
            lag = scalar(
                url,
                "SELECT extract(epoch from clock_timestamp()) - finished_at FROM tasks"
                " WHERE response_id = ?",
                own["id"],
            )
            assert -5 < float(lag) < 60, lag
            row = scalar(url, "SELECT clock_skew FROM nodes WHERE id = 'b'")
            assert row is not None and float(row) < -7 * DAY  # it measured its clock
        assert scalar(url, "SELECT count(*) FROM responses WHERE id = ?", fresh["id"]) == 1

        # ``lmsp doctor`` on the skewed machine fails, with one verdict
        env = {
            **os.environ,
            **ahead,
            "LMSP_DATABASE_URL": url,
            "LMSP_DATA_DIR": str(skewed.data_dir),
        }
        run = subprocess.run(
            [sys.executable, "-m", "lmsp", "doctor"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = run.stdout + run.stderr
        assert run.returncode != 0, out
        assert "LMSP_MAX_CLOCK_SKEW" in out
        assert "all checks passed" not in out
        assert "check(s) failed" in out
    finally:
        skewed.stop()
        first.stop()
