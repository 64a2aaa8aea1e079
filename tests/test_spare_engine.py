"""``LMSP_SPARE_ENGINE=1``: each loaded model keeps a second engine process loaded, which
takes over at once when the serving one crashes — through a real ``lmsp serve`` on the
real model:

- the spare is made once the model has loaded, and runs nothing;
- ``kill -9`` of the serving engine mid-generation (exact mode): the spare serves the
  resumed task (its process id is the spare's), which ends with the text of an
  uninterrupted run, its events gap-free; a new spare is made;
- a normal stop of the service ends the serving engine and the spare.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import Server, check_log_invariants, finish, open_db, wait_exited
from tests.test_engine_reattach import engine_pid, under_way, uninterrupted
from tests.test_resume import text_of

MODEL = "smollm2-135m-instruct"
SPARE = re.compile(r"a spare engine for smollm2-135m-instruct is ready \(pid (\d+)\)")

pytestmark = pytest.mark.slow


def spares(server: Server, count: int) -> list[int]:
    """The pids of the first ``count`` spares the log announced (waited for)."""
    deadline = time.monotonic() + 180
    while len(found := SPARE.findall(server.log_path.read_text())) < count:
        assert time.monotonic() < deadline, server.log_path.read_text()[-3000:]
        time.sleep(0.05)
    return [int(pid) for pid in found]


def test_a_spare_engine_takes_over_a_crashed_one(tmp_path: Path) -> None:
    env = {"LMSP_SPARE_ENGINE": "1", "LMSP_EXACT": "1", "LMSP_PARALLEL": "2"}
    server = Server(tmp_path / "data", env=env).start()
    pids: list[int] = []
    try:
        with server.client() as http:
            whole = uninterrupted(http)
            serving = engine_pid(http, MODEL)
            (spare,) = spares(server, 1)
            assert spare != serving
            made = under_way(http)
            os.kill(serving, signal.SIGKILL)  # the serving engine crashes mid-generation
            resumed = finish(http, made)
            assert engine_pid(http, MODEL) == spare  # the spare took over
            pids = [serving, *spares(server, 2)]  # and a new spare was made
        assert resumed["status"] == "incomplete", resumed
        assert text_of(resumed) == text_of(whole)  # exact mode: as if never interrupted
        check_log_invariants(open_db(server.data_dir))
    finally:
        server.stop()
    for pid in pids:
        assert wait_exited(pid, 30), f"engine {pid} outlived a stopped service"
