"""The ``lmsp`` command finds the service of its data directory on whatever port it
listens (issue 36, item 15): ``lmsp serve`` notes its address in the directory's lock
file, the command (and :class:`lmsp.Client`) reads it when no URL is given, and a
"cannot reach" error never tells a user to start a server already running on that
directory (following that hint failed ``data_dir_in_use``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lmsp
from lmsp import datadir
from tests.helpers import Server, free_port, seeded_data_dir

pytestmark = pytest.mark.slow


def lmsp_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A newcomer's shell: only the data directory named, no URL, no port, no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_")}
    env.update({"LMSP_DATA_DIR": str(data_dir), **extra})
    return env


def lmsp_cli(data_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmsp", *args],
        env=lmsp_env(data_dir, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_finds_a_service_on_another_port(tmp_path: Path, blob_cache: Path) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data_dir).start()  # on a free port, not 8430
    try:
        assert server.port != 8430
        lock = (data_dir / "lmsp.lock").read_text()
        assert f"url {server.url}" in lock.splitlines(), lock
        shown = lmsp_cli(data_dir, "ps")
        assert shown.returncode == 0, shown.stderr
        assert "Models loaded" in shown.stdout
        listed = lmsp_cli(data_dir, "models", "ls", "--json")
        assert listed.returncode == 0 and "lmsp-test" in listed.stdout, listed.stderr

        # the Python client finds it too
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("LMSP_")}
        os.environ["LMSP_DATA_DIR"] = str(data_dir)
        try:
            with lmsp.Client() as api:
                assert api.base_url == server.url
                assert any(m["id"] == "lmsp-test" for m in api.models())
        finally:
            os.environ.pop("LMSP_DATA_DIR")
            os.environ.update(saved)

        # an explicit address wins; wrong, its error names where the service is, and
        # does not send the user to start a second server on the directory
        wrong = f"http://127.0.0.1:{free_port()}"
        missed = lmsp_cli(data_dir, "ps", LMSP_URL=wrong)
        assert missed.returncode == 1
        line = missed.stderr.strip()
        assert line.startswith(f"Error: cannot reach lmsp at {wrong}: "), line
        assert server.url in line and "lmsp serve`" not in line, line
        assert line.endswith("(unreachable)"), line

        # what a user who follows the old hint sees: the refusal says where it serves
        second = lmsp_cli(data_dir, "serve", LMSP_PORT=str(free_port()))
        assert second.returncode == 1
        assert "data_dir_in_use" in second.stderr and server.url in second.stderr, second.stderr
    finally:
        server.stop()

    # stopped, the directory names no service: the hint to start one comes back
    assert datadir.holder(data_dir) is None
    gone = lmsp_cli(data_dir, "ps")
    assert gone.returncode == 1 and "start it with `lmsp serve`" in gone.stderr, gone.stderr


def test_a_killed_server_leaves_no_address_that_is_believed(
    tmp_path: Path, blob_cache: Path
) -> None:
    """``kill -9`` leaves the lock file as it was; its lock went with the process, so
    its address is not used and the hint is to start the service."""
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    server = Server(data_dir).start()
    port = server.port
    server.kill()
    assert f":{port}" in (data_dir / "lmsp.lock").read_text()
    assert datadir.holder(data_dir) is None
    gone = lmsp_cli(data_dir, "ps", LMSP_PORT=str(free_port()))
    assert gone.returncode == 1
    assert f":{port}" not in gone.stderr and "start it with `lmsp serve`" in gone.stderr


def test_a_holder_that_does_not_answer_yet_is_not_started_again(tmp_path: Path) -> None:
    """A server that holds the directory but is not listening yet (recovery runs before
    it listens) is named as such, not restarted; a holder that serves nothing
    (``lmsp gc``) is named too."""
    data_dir = tmp_path / "data"
    lock = datadir.acquire(data_dir, "lmsp serve")
    try:
        quiet = f"http://127.0.0.1:{free_port()}"
        lock.record_address(quiet)
        found = datadir.holder(data_dir)
        assert found is not None and found.url == quiet and found.pid == str(os.getpid())
        waiting = lmsp_cli(data_dir, "tasks", "ls")
        line = waiting.stderr.strip()
        assert waiting.returncode == 1 and quiet in line, line
        assert "still starting" in line and "start it with" not in line, line
        assert re.search(rf"pid {os.getpid()}\b", line), line
    finally:
        lock.release()
    lock = datadir.acquire(data_dir, "lmsp gc")
    try:
        busy = lmsp_cli(data_dir, "tasks", "ls", LMSP_PORT=str(free_port()))
        line = busy.stderr.strip()
        assert "lmsp gc" in line and "start it with" not in line, line
    finally:
        lock.release()
