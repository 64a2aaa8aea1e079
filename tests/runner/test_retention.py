from __future__ import annotations

import os
import time
from pathlib import Path

from click.testing import CliRunner
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.app.root import open_service
from lmsp.app.service import Service
from lmsp.cli import main
from lmsp.config import Settings
from lmsp.engines.kvfiles import SUFFIX, PrefixFiles, dir_name, prefix_key
from lmsp.runner.retention import sweep
from lmsp.store import idempotency
from lmsp.store import tasks as task_store
from tests.runner.test_runner import enqueue, owner_id

DAY = 86400


def backdate(svc: Service, task_id: str, seconds: int) -> None:
    def job(conn):  # type: ignore[no-untyped-def]
        conn.execute(
            "UPDATE tasks SET created_at = created_at - ?, updated_at = updated_at - ?,"
            " finished_at = finished_at - ? WHERE id = ?",
            (seconds, seconds, seconds, task_id),
        )

    svc.db.write_sync(job)


def counts(svc: Service) -> tuple[int, int, int]:
    conn = svc.db.reader()
    return tuple(  # type: ignore[return-value]
        conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("responses", "tasks", "task_events")
    )


def test_old_finished_work_goes_and_unfinished_work_stays(svc: Service) -> None:
    old_done = enqueue(svc)
    svc.runner.run_next()
    old_cancelled = enqueue(svc)
    svc.db.write_sync(lambda c: task_store.cancel(c, old_cancelled))
    fresh_done = enqueue(svc)
    svc.runner.run_next()
    old_queued = enqueue(svc)  # unfinished and far older than the period
    old_running = enqueue(svc)
    svc.db.write_sync(lambda c: task_store.move(c, old_running, task_store.Status.LOADING))
    for task_id in (old_done, old_cancelled, old_queued, old_running):
        backdate(svc, task_id, 30 * DAY)

    swept = sweep(svc.db, retention=7 * DAY)

    assert swept.responses == 2
    conn = svc.db.reader()
    remaining = {r[0] for r in conn.execute("SELECT id FROM tasks")}
    assert remaining == {fresh_done, old_queued, old_running}
    orphans = conn.execute(
        "SELECT count(*) FROM task_events WHERE task_id NOT IN (SELECT id FROM tasks)"
    ).fetchone()[0]
    assert orphans == 0
    assert sweep(svc.db, retention=7 * DAY).responses == 0


def test_cleanup_runs_in_small_batches(svc: Service) -> None:
    ids = []
    for _ in range(5):
        ids.append(enqueue(svc))
        svc.runner.run_next()
    for task_id in ids:
        backdate(svc, task_id, 2 * DAY)
    from lmsp.runner.retention import delete_finished_batch

    assert svc.db.write_sync(lambda c: delete_finished_batch(c, DAY, 2)) == 2
    assert counts(svc)[1] == 3
    assert sweep(svc.db, retention=DAY).responses == 3


def test_expired_idempotency_keys_go(svc: Service) -> None:
    client_id = owner_id(svc)
    live = idempotency.Key(client_id, "live", "d1", ttl=DAY)
    dead = idempotency.Key(client_id, "dead", "d2", ttl=-10)
    svc.db.write_sync(lambda c: idempotency.record(c, live, 200, None))
    svc.db.write_sync(lambda c: idempotency.record(c, dead, 200, None))
    assert sweep(svc.db, retention=DAY).idempotency_keys == 1
    keys = [r[0] for r in svc.db.reader().execute("SELECT key FROM idempotency_keys")]
    assert keys == ["live"]


def test_gc_command_cleans_a_data_directory(settings: Settings) -> None:
    service = open_service(settings)
    try:
        done = enqueue(service)
        service.runner.run_next()
        backdate(service, done, 10 * DAY)
        waiting = enqueue(service)
        backdate(service, waiting, 10 * DAY)
    finally:
        service.db.close()
    result = CliRunner().invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
    assert result.exit_code == 0, result.output
    assert "deleted 1 finished responses" in result.output
    again = open_service(settings)
    try:
        assert {r[0] for r in again.db.reader().execute("SELECT id FROM tasks")} == {waiting}
    finally:
        again.db.close()


def test_gc_command_rejects_a_bad_duration(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["gc", "--data-dir", str(tmp_path), "--retention", "soon"])
    assert result.exit_code != 0
    assert "invalid duration" in result.output


def test_the_server_sweeps_periodically(settings: Settings) -> None:
    fast = settings.with_overrides(gc_interval=0.1, retention=DAY)
    with TestClient(create_app(fast)) as client:
        token = (fast.data_dir / "owner.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        created = client.post("/v1/responses", json={"model": "lmsp-test", "input": "x"})
        assert created.json()["status"] == "completed"
        svc: Service = client.app.state.lmsp  # type: ignore[attr-defined]
        backdate(svc, created.json()["task"]["id"], 2 * DAY)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and counts(svc)[0]:
            time.sleep(0.05)
        assert counts(svc) == (0, 0, 0)
        assert client.get(f"/v1/responses/{created.json()['id']}").status_code == 404


def test_the_sweep_bounds_the_prefix_cache(svc: Service) -> None:
    """Saved prefixes of models no record names go, and so do those unused for the
    cache's ttl; a fresh one of a model that exists stays."""
    assert svc.kv is not None
    digest = svc.db.reader().execute("SELECT digest FROM models LIMIT 1").fetchone()[0]
    gone_model = "sha256:" + "0" * 64
    svc.kv.save(digest, [1, 2, 3], b"fresh")
    svc.kv.save(digest, [4, 5, 6], b"old")
    svc.kv.save(gone_model, [1, 2, 3], b"orphan")
    now = time.time()
    old = svc.settings.kv_dir / dir_name(digest) / f"{prefix_key([4, 5, 6])}{SUFFIX}"
    os.utime(old, (now - svc.settings.kv_cache_ttl - 60,) * 2)

    swept = sweep(svc.db, retention=DAY, kv=svc.kv)

    assert swept.kv_bytes > 0
    assert svc.kv.best(digest, [1, 2, 3, 4]) == (3, b"fresh")
    assert svc.kv.best(digest, [4, 5, 6]) is None
    assert svc.kv.best(gone_model, [1, 2, 3]) is None
    assert not (svc.settings.kv_dir / dir_name(gone_model)).exists()


def test_gc_command_sweeps_the_prefix_cache(settings: Settings) -> None:
    open_service(settings).db.close()
    kv = PrefixFiles(settings.kv_dir, max_bytes=1 << 20, ttl=DAY)
    kv.save("sha256:" + "0" * 64, [1, 2, 3], b"of a model no record names")
    result = CliRunner().invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
    assert result.exit_code == 0, result.output
    assert "bytes of saved prompt prefixes" in result.output
    assert kv.usage() == 0
