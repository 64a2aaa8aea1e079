"""One owner per data directory, private files, and blobs no record names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from lmsp.app.root import open_service
from lmsp.cli import main
from lmsp.config import Settings
from tests.helpers import Server, check_log_invariants, open_db, seeded_data_dir, task_log


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, so that a file created without an explicit mode is 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- one owner ---------------------------------------------------------------------------------


def test_a_second_service_in_the_same_directory_is_refused(settings: Settings) -> None:
    svc = open_service(settings)
    try:
        with pytest.raises(Exception, match="in use by another lmsp process") as refused:
            open_service(settings)
        assert f"pid {os.getpid()}" in str(refused.value)
        result = CliRunner().invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
        assert result.exit_code == 1
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0], result.output
    finally:
        svc.db.close()
    again = open_service(settings)  # closing the database released the lock
    again.db.close()


def wait_until(condition, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_second_server_changes_nothing_of_the_live_ones_tasks(
    tmp_path: Path, blob_cache: Path
) -> None:
    """The live server has a ``resume`` task running and ``fail`` tasks queued; a second
    ``lmsp serve`` on its directory must refuse at once, naming the holder's pid, and
    leave every task as it was: the queued ones still queued, the running one generated
    once (its deltas equal its output)."""
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    one_at_a_time = {"LMSP_TEST_ENGINE_DELAY": "0.25", "LMSP_PARALLEL": "1"}
    live = Server(data_dir, env=one_at_a_time).start()
    second = Server(data_dir, env=one_at_a_time)
    try:
        with live.client() as http:
            body = {"model": "lmsp-test", "background": True}
            running = http.post(
                "/v1/responses", json={**body, "input": "resume me", "on_restart": "resume"}
            ).json()
            queued = [
                http.post(
                    "/v1/responses", json={**body, "input": f"q{i}", "on_restart": "fail"}
                ).json()
                for i in range(3)
            ]

            def generating() -> bool:
                task = http.get(f"/v1/tasks/{running['task']['id']}").json()
                return bool(task["last_sequence_number"] >= 5)

            wait_until(generating, "the resume task to be generating")
            with pytest.raises(RuntimeError) as refused:
                second.start(wait=60)
            said = second.log_path.read_text()
            assert f"pid {live.proc.pid}" in said, said  # type: ignore[union-attr]
            assert "in use by another lmsp process" in str(refused.value)
            for q in queued[1:]:  # the first may have started meanwhile
                assert http.get(f"/v1/tasks/{q['task']['id']}").json()["status"] == "queued"

            def finished() -> bool:
                tasks = http.get("/v1/tasks").json()["data"]
                return all(t["status"] == "completed" for t in tasks)

            wait_until(finished, "every task to complete", timeout=120)
            final = http.get(f"/v1/responses/{running['id']}").json()
        live.stop()
        conn = open_db(data_dir)
        try:
            check_log_invariants(conn)
            log = task_log(conn, running["task"]["id"])
        finally:
            conn.close()
        deltas = "".join(e["delta"] for e in log if e["type"] == "response.output_text.delta")
        assert deltas == final["output"][0]["content"][0]["text"]
        assert not [e for e in log if e.get("resumed")]
    finally:
        second.kill()
        live.kill()


@pytest.mark.slow
def test_a_port_in_use_is_found_before_recovery_changes_anything(
    tmp_path: Path, blob_cache: Path
) -> None:
    """A server whose port is taken refuses before it recovers: the leftover tasks of
    its data directory are untouched (not failed with ``server_restarted``)."""
    left = seeded_data_dir(tmp_path / "left", blob_cache)
    crashed = Server(left, env={"LMSP_TEST_ENGINE_DELAY": "0.2"}).start()
    with crashed.client() as http:
        ids = [
            http.post(
                "/v1/responses",
                json={"model": "lmsp-test", "input": f"x{i}", "background": True},
            ).json()["task"]["id"]
            for i in range(3)
        ]
    crashed.kill()
    other = Server(seeded_data_dir(tmp_path / "other", blob_cache)).start()
    env = dict(os.environ, LMSP_DATA_DIR=str(left), LMSP_PORT=str(other.port))
    env["LMSP_ENABLE_TEST_ENGINE"] = "1"
    try:
        late = subprocess.run(
            [sys.executable, "-m", "lmsp", "serve"], env=env, capture_output=True, timeout=60
        )
        assert late.returncode == 1
        said = late.stderr.decode().strip().splitlines()
        assert len(said) == 1 and "cannot listen" in said[0], said
        conn = open_db(left)
        try:
            statuses = {r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM tasks")}
        finally:
            conn.close()
        assert [statuses[i] for i in ids].count("failed") == 0, statuses
        assert httpx.get(f"{other.url}/healthz").status_code == 200
    finally:
        other.stop()


# -- private files ------------------------------------------------------------------------------


def test_a_new_data_directory_is_private(tmp_path: Path, blob_cache: Path, umask_022: None) -> None:
    settings = Settings(data_dir=tmp_path / "fresh" / "data", enable_test_engine=True)
    svc = open_service(settings)
    try:
        svc.db.write_sync(lambda c: c.execute("CREATE TABLE t (x)"))
        assert mode(settings.data_dir) == 0o700
        assert mode(settings.blobs_dir) == 0o700
        for name in ("lmsp.db", "lmsp.db-wal", "lmsp.db-shm", "owner.token", "lmsp.lock"):
            assert mode(settings.data_dir / name) == 0o600, name
        assert all(mode(p) == 0o600 for p in settings.blobs_dir.iterdir())
    finally:
        svc.db.close()


@pytest.mark.slow
def test_the_server_creates_private_files(
    tmp_path: Path, blob_cache: Path, umask_022: None
) -> None:
    server = Server(tmp_path / "srv", seed=False).start()  # the server makes the directory
    try:
        with server.client() as http:
            http.post("/v1/responses", json={"model": "lmsp-test", "input": "hi"})
        assert mode(server.data_dir) == 0o700
        for name in ("lmsp.db", "lmsp.db-wal", "lmsp.db-shm", "owner.token"):
            assert mode(server.data_dir / name) == 0o600, name
    finally:
        server.stop()


def test_doctor_warns_about_wider_modes(settings: Settings) -> None:
    svc = open_service(settings)
    svc.db.close()
    os.chmod(settings.data_dir, 0o755)
    os.chmod(settings.db_path, 0o644)
    result = CliRunner().invoke(main, ["doctor", "--data-dir", str(settings.data_dir), "--json"])
    checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
    assert checks["permissions"]["status"] == "warn"
    assert "0755" in checks["permissions"]["detail"] and "0644" in checks["permissions"]["detail"]


# -- orphans ------------------------------------------------------------------------------------


def orphan_blob(settings: Settings) -> Path:
    """What a crash between renaming a copy into place and committing its record leaves."""
    path = settings.blobs_dir / ("sha256-" + "ab" * 32)
    path.write_bytes(b"GGUF an import that never committed")
    return path


def test_doctor_reports_and_gc_removes_unreferenced_blobs(settings: Settings) -> None:
    svc = open_service(settings)
    svc.db.close()
    orphan = orphan_blob(settings)
    result = CliRunner().invoke(main, ["doctor", "--data-dir", str(settings.data_dir), "--json"])
    checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
    assert checks["unreferenced blobs"]["status"] == "warn"
    result = CliRunner().invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
    assert result.exit_code == 0, result.output
    assert "removed 1 model blob" in result.output
    assert not orphan.exists()
    models = [p for p in settings.blobs_dir.iterdir()]
    assert models, "the blobs records name are kept"


def test_startup_removes_unreferenced_blobs(settings: Settings) -> None:
    svc = open_service(settings)
    svc.db.close()
    orphan = orphan_blob(settings)
    svc = open_service(settings)
    try:
        assert not orphan.exists()
        assert len(list(settings.blobs_dir.iterdir())) == 2  # the default and test models
    finally:
        svc.db.close()
