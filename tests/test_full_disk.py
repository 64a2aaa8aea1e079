"""A full disk: ``507 insufficient_storage`` with nothing half-written, tasks that reach a
terminal state by their policy once space returns, and ``/healthz`` saying "degraded"
meanwhile — on a real small filesystem, and through the writer's fault seam."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.config import Settings
from tests.campaigns.smallfs import fill, require_small_fs, seed_by_symlink, small_fs
from tests.helpers import Server, check_log_invariants, open_db, task_log


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def text_of(obj: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "") for item in obj.get("output", []) for part in item["content"]
    )


def deltas(log: list[dict[str, Any]]) -> str:
    resets = [i for i, e in enumerate(log) if e.get("reset")]
    start = resets[-1] if resets else 0
    return "".join(e["delta"] for e in log[start:] if e["type"] == "response.output_text.delta")


# -- in process, through the fault seam -----------------------------------------------------


@pytest.fixture
def slow_client(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.05")
    with TestClient(create_app(settings)) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def counts(settings: Settings) -> tuple[int, int, int, int]:
    conn = open_db(settings.data_dir)
    try:
        return tuple(  # type: ignore[return-value]
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("responses", "tasks", "task_events", "idempotency_keys")
        )
    finally:
        conn.close()


def test_a_create_on_a_full_disk_answers_507_and_writes_nothing(
    slow_client: TestClient, settings: Settings
) -> None:
    from lmsp.store.db import Faults

    db = slow_client.app.state.lmsp.db  # type: ignore[attr-defined]
    before = counts(settings)
    db.faults = Faults(all_writes=True)
    try:
        body = {"model": "lmsp-test", "input": "x", "background": True}
        answer = slow_client.post("/v1/responses", json=body, headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 507, answer.text
        error = answer.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "insufficient_storage"
        assert slow_client.get("/healthz").status_code == 503
        assert slow_client.get("/healthz").json()["status"] == "degraded"
        assert slow_client.get("/v1/models").status_code == 200  # reads still work
    finally:
        db.faults = None
    assert counts(settings) == before
    # space is back: the same key creates the response, once
    answer = slow_client.post(
        "/v1/responses", json={**body, "background": False}, headers={"Idempotency-Key": "k2"}
    )
    assert answer.status_code == 200 and answer.json()["status"] == "completed"
    assert slow_client.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_a_running_task_whose_writes_fail_settles_by_its_policy(
    slow_client: TestClient, settings: Settings, policy: str
) -> None:
    """Its output flushes fail, then its terminal write: it must not stay ``running``.
    While the disk is full it is retried (``/healthz`` degraded); once writes work, it
    ends by its ``on_restart`` policy, with no restart: ``fail`` → failed
    (``insufficient_storage``), ``retry`` → run again from the start, ``resume`` → run
    on from its snapshot; the deltas always equal the output."""
    from lmsp.store.db import Faults

    svc = slow_client.app.state.lmsp  # type: ignore[attr-defined]
    body = {"model": "lmsp-test", "input": f"full {policy}", "background": True}
    created = slow_client.post("/v1/responses", json={**body, "on_restart": policy}).json()
    task_id = created["task"]["id"]

    def generating() -> bool:
        return bool(slow_client.get(f"/v1/tasks/{task_id}").json()["last_sequence_number"] >= 6)

    wait_until(generating, "output")
    svc.db.faults = Faults(all_writes=True)
    try:
        wait_until(lambda: svc.db.health.retrying > 0, "the runner to retry its write")
        assert slow_client.get("/healthz").json()["status"] == "degraded"
        assert slow_client.get(f"/v1/tasks/{task_id}").json()["status"] == "running"
        refused = slow_client.post(f"/v1/responses/{created['id']}/cancel")
        assert refused.status_code == 507  # the cancel cannot be written either
    finally:
        svc.db.faults = None

    def finished() -> bool:
        status = slow_client.get(f"/v1/tasks/{task_id}").json()["status"]
        return status in ("completed", "failed", "cancelled")

    wait_until(finished, "the task to finish")
    final = slow_client.get(f"/v1/responses/{created['id']}").json()
    if policy == "fail":
        assert final["status"] == "failed"
        assert final["error"]["code"] == "insufficient_storage"
    else:
        assert final["status"] == "completed"
    conn = open_db(settings.data_dir)
    try:
        check_log_invariants(conn)
        log = task_log(conn, task_id)
    finally:
        conn.close()
    assert deltas(log) == text_of(final)
    if policy == "resume":
        assert [e for e in log if e.get("resumed")], "it ran on from its snapshot"
    wait_until(lambda: slow_client.get("/healthz").status_code == 200, "health to come back")
    again = slow_client.post("/v1/responses", json={"model": "lmsp-test", "input": "after"})
    assert again.json()["status"] == "completed"


# -- a real small filesystem -------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_filesystem_answers_507_and_recovers_without_restart(
    tmp_path: Path, blob_cache: Path
) -> None:
    require_small_fs()
    with small_fs(tmp_path / "small", 24) as mount:
        data_dir = seed_by_symlink(mount / "data", blob_cache)
        server = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.05"})
        server.log_path = tmp_path / "server.log"
        server.start()
        try:
            with server.client(timeout=30) as http:
                body = {"model": "lmsp-test", "background": True}
                running = [
                    http.post(
                        "/v1/responses", json={**body, "input": f"r{p}", "on_restart": p}
                    ).json()
                    for p in ("resume", "fail", "retry")
                ]
                filler = mount / "filler"
                fill(filler)
                codes: list[int] = []
                for i in range(400):
                    answer = http.post("/v1/responses", json={**body, "input": f"f{i}" * 300})
                    codes.append(answer.status_code)
                    if answer.status_code != 202:
                        assert answer.status_code == 507, answer.text
                        assert answer.json()["error"]["code"] == "insufficient_storage"
                        break
                assert codes[-1] == 507, "the disk never filled up"
                health = httpx.get(f"{server.url}/healthz")
                assert health.status_code == 503 and health.json()["status"] == "degraded"
                filler.unlink()

                def all_finished() -> bool:
                    tasks = http.get("/v1/tasks", params={"limit": 100}).json()["data"]
                    return all(t["status"] in ("completed", "failed") for t in tasks)

                wait_until(all_finished, "every task to finish once space is back", 120)
                wait_until(lambda: httpx.get(f"{server.url}/healthz").status_code == 200, "health")
                after = http.post("/v1/responses", json={"model": "lmsp-test", "input": "ok"})
                assert after.status_code == 200 and after.json()["status"] == "completed"
                finals = [http.get(f"/v1/responses/{r['id']}").json() for r in running]
            server.stop()
            conn = open_db(data_dir)
            try:
                check_log_invariants(conn)
                for final in finals:
                    log = task_log(conn, final["task"]["id"])
                    if final["status"] == "completed":
                        assert deltas(log) == text_of(final)
            finally:
                conn.close()
        finally:
            server.kill()


# -- the prefix cache on a small filesystem (issue 17, finding 4) ------------------------------


def kv_files(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "kv").glob("*/*.kv")]


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def long_prompt(i: int) -> str:
    """About 300 tokens (a saved prefix of ~7 MB), different for each ``i``."""
    words = random.Random(i).choices(
        ["river", "lamp", "stone", "orbit", "cedar", "violet", "harbor", "signal", "quartz"], k=260
    )
    return f"Note {i}: " + " ".join(words) + ". Summarize the note."


def settled(data_dir: Path) -> None:
    """Wait until the engine's background saves are written (no temporary file left)."""
    time.sleep(0.5)
    wait_until(lambda: not list((data_dir / "kv").glob("*/.tmp-*")), "the saves to finish")


@pytest.mark.slow
def test_the_prefix_cache_never_fills_the_disk_and_a_full_disk_heals_itself(
    tmp_path: Path, blob_cache: Path
) -> None:
    """37 small requests filled a 200 MB disk with saved prefixes (6-11 MB each), and from
    then on every client got 507 until files were deleted by hand. Now the cache keeps a
    free-space reserve (a tenth of the disk), is evicted when a durable write finds the
    disk full anyway, and once space returns the service is healthy again by itself."""
    from lmsp.bootstrap import DEFAULT_MODEL_ID

    require_small_fs()
    with small_fs(tmp_path / "small", 32) as mount:
        data_dir = seed_by_symlink(mount / "data", blob_cache)
        reserve = os.statvfs(mount).f_blocks * os.statvfs(mount).f_frsize // 10
        server = Server(data_dir, env={"LMSP_PARALLEL": "1"})
        server.log_path = tmp_path / "server.log"
        server.start()
        try:
            with server.client(timeout=300) as http:
                body = {"model": DEFAULT_MODEL_ID, "max_output_tokens": 1}
                # 1. prompts that each save a prefix of several MB: the cache stops at the
                # reserve, evicting its oldest entries, and every request succeeds
                for i in range(5):
                    answer = http.post("/v1/responses", json={**body, "input": long_prompt(i)})
                    assert answer.status_code == 200, answer.text
                    settled(data_dir)
                    assert free_bytes(mount) >= reserve // 2, (i, free_bytes(mount), reserve)
                sizes = [p.stat().st_size for p in kv_files(data_dir)]
                assert sizes and min(sizes) > 4 << 20, sizes  # several MB each
                assert len(sizes) < 5  # the oldest went to keep the reserve free
                # 2. something else fills the disk: the next write evicts the cache first
                # and succeeds (no 507, /healthz never degraded)
                filler = mount / "filler"
                fill(filler)
                before = len(kv_files(data_dir))
                answer = http.post("/v1/responses", json={**body, "input": "Hello again."})
                assert answer.status_code == 200, answer.text
                assert len(kv_files(data_dir)) < before
                assert "prefix cache:" in server.log_path.read_text()
                assert httpx.get(f"{server.url}/healthz").status_code == 200
                # 3. once the cache is spent, a full disk is 507 and degraded ...
                fillers = [filler]
                for k in range(20):  # each fill takes what the cache gave back
                    fillers.append(mount / f"filler{k}")
                    fill(fillers[-1])
                    answer = http.post(
                        "/v1/responses",
                        json={"model": "lmsp-test", "input": "more", "background": True},
                    )
                    if answer.status_code != 202:
                        break
                assert answer.status_code == 507, answer.text
                assert kv_files(data_dir) == []
                assert httpx.get(f"{server.url}/healthz").status_code == 503
                # ... until space returns: healthy again with no restart and no hand work
                # on the data directory
                for path in fillers:
                    path.unlink()
                wait_until(
                    lambda: httpx.get(f"{server.url}/healthz").status_code == 200, "health", 60
                )
                again = http.post("/v1/responses", json={"model": "lmsp-test", "input": "ok"})
                assert again.status_code == 200, again.text
            server.stop()
            conn = open_db(data_dir)
            try:
                check_log_invariants(conn)
            finally:
                conn.close()
        finally:
            server.kill()
