"""``lmsp serve --standby``: a second process, everything it serves with imported, waits
for the data directory's lock and takes over the moment the serving process exits,
however it exits — through real ``lmsp serve`` processes:

- while the service lives, the standby holds nothing: it has not bound the port, opened
  the database or taken the lock (a plain ``lmsp serve`` is still refused, naming the
  holder), and says whom it waits for;
- ``kill -9`` of the service mid-generation (the real model, exact mode, engines that
  outlive it): the standby takes the lock, binds the same port, reattaches to the same
  engine process and resumes the task to the text of an uninterrupted run, its events
  gap-free;
- on a free directory a standby simply serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, finish, open_db
from tests.hub_standin import split_gguf
from tests.test_engine_reattach import engine_pid, under_way, uninterrupted
from tests.test_resume import text_of

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.slow


def test_a_standby_takes_over_a_killed_service_and_resumes_its_task(tmp_path: Path) -> None:
    env = {"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s", "LMSP_EXACT": "1", "LMSP_PARALLEL": "2"}
    server = Server(tmp_path / "data", env=env).start()
    spare: Server | None = None
    try:
        with server.client() as http:
            whole = uninterrupted(http)
            pid = engine_pid(http, MODEL)
        spare = server.standby()
        assert server.proc is not None
        assert f"pid {server.proc.pid}" in spare.log_path.read_text()  # whom it waits for
        second = subprocess.run(
            [sys.executable, "-m", "lmsp", "serve", "--port", "0"],
            env={**os.environ, **env, "LMSP_DATA_DIR": str(server.data_dir)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1 and "in use by another lmsp process" in second.stderr
        with server.client() as http:  # the service still answers, alone on its port
            made = under_way(http)
        server.kill()  # kill -9 of the API process, the task half done
        killed = time.monotonic()
        spare.wait_healthy()
        print(f"the standby served {time.monotonic() - killed:.2f} s after the kill")
        with spare.client() as http:
            resumed = finish(http, made)
            assert engine_pid(http, MODEL) == pid  # the same engine process: reattached
        assert resumed["status"] == "incomplete", resumed
        assert text_of(resumed) == text_of(whole)  # exact mode: as if never interrupted
        check_log_invariants(open_db(server.data_dir))
        took = spare.log_path.read_text()
        assert "standby: taking over" in took
        assert "reattached to the engine of smollm2-135m-instruct" in took
    finally:
        server.stop()
        if spare is not None:
            spare.stop()


def test_a_standby_on_a_free_directory_serves_at_once(tmp_path: Path) -> None:
    spare = Server(tmp_path / "data", args=("--standby",)).start()
    try:
        assert httpx.get(f"{spare.url}/healthz").status_code == 200
        assert "standby: taking over" in spare.log_path.read_text()
    finally:
        spare.stop()


def test_the_standby_makes_each_whole_models_tokenizer_and_passes_over_split_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a standby prepares while it waits (:func:`preload_tokenizers`): the tokenizer
    of the bundled model, keyed by its blob's digest; a split model's parts (which load
    only together, under the names the model host links) and a blob that is no GGUF are
    passed over without a load being tried."""
    from lmsp.bootstrap import bundled_model_path
    from lmsp.cluster import startup
    from lmsp.config import from_env
    from lmsp.engines.llama_cpp import LlamaEngine

    settings = from_env({"LMSP_DATA_DIR": str(tmp_path / "data")})
    blobs = settings.blobs_dir
    blobs.mkdir(parents=True)
    first, second = split_gguf(bundled_model_path(), tmp_path, "Split")
    named = {"whole": bundled_model_path(), "first": first, "second": second}
    for name, source in named.items():
        (blobs / f"sha256-{name}").symlink_to(source)
    (blobs / "sha256-text").write_text("not a model")
    tried: list[str] = []
    make = LlamaEngine.tokenizer

    def recorded(self: LlamaEngine, path: Path, *args: object) -> object:
        tried.append(path.name)
        return make(self, path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaEngine, "tokenizer", recorded)
    made = startup.preload_tokenizers(settings)
    try:
        assert list(made) == ["sha256:whole"]
        assert tried == ["sha256-whole"]
        assert made["sha256:whole"].text_tokens("Hello") == [19556]  # the model's vocabulary
    finally:
        for tokenizer in made.values():
            tokenizer.close()
