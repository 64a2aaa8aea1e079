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


def test_the_standby_hashes_and_makes_each_whole_model_and_passes_over_split_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a standby prepares while it waits (:func:`startup.prepare`): the bundled
    model's blob hashed and found intact, and its tokenizer, keyed by its digest; a blob
    whose bytes are not what its name says is not taken as checked (its tokenizer is
    made: a load checks it again first); a split model's parts (which load only
    together, under the names the model host links) and a blob that is no GGUF are
    passed over without a load being tried."""
    from lmsp.bootstrap import bundled_model_path
    from lmsp.cluster import startup
    from lmsp.config import from_env
    from lmsp.engines.llama_cpp import LlamaEngine
    from lmsp.store.blobs import hash_file

    settings = from_env({"LMSP_DATA_DIR": str(tmp_path / "data")})
    blobs = settings.blobs_dir
    blobs.mkdir(parents=True)
    digest = hash_file(bundled_model_path())[0]
    whole = "sha256-" + digest.removeprefix("sha256:")
    first, second = split_gguf(bundled_model_path(), tmp_path, "Split")
    named = {whole: bundled_model_path(), "sha256-misnamed": bundled_model_path()}
    named |= {"sha256-first": first, "sha256-second": second}
    for name, source in named.items():
        (blobs / name).symlink_to(source)
    (blobs / "sha256-text").write_text("not a model")
    tried: list[str] = []
    make = LlamaEngine.tokenizer

    def recorded(self: LlamaEngine, path: Path, *args: object) -> object:
        tried.append(path.name)
        return make(self, path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaEngine, "tokenizer", recorded)
    made = startup.prepare(settings)
    try:
        assert sorted(made.tokenizers) == sorted([digest, "sha256:misnamed"])
        assert sorted(tried) == sorted([whole, "sha256-misnamed"])
        assert made.verified == {digest}
        assert made.tokenizers[digest].text_tokens("Hello") == [19556]  # the model's vocabulary
    finally:
        for tokenizer in made.tokenizers.values():
            tokenizer.close()


def test_the_standby_has_imported_what_the_servers_start_imports() -> None:
    """uvicorn imports its protocols and event loop as its server starts (15-20 ms on
    this machine, after the takeover): a standby has them imported already."""
    script = """
import importlib, sys
from lmsp.cli import STANDBY_IMPORTS
for name in STANDBY_IMPORTS:
    importlib.import_module(name)
import uvicorn.loops.uvloop
before = set(sys.modules)
import uvicorn
async def app(scope, receive, send): ...
config = uvicorn.Config(
    app, http="httptools", ws="websockets-sansio", ws_per_message_deflate=False, log_config=None
)
config.load()
config.get_loop_factory()
new = sorted(set(sys.modules) - before)
print([m for m in new if m.split(".")[0] in ("uvicorn", "websockets", "httptools", "uvloop")])
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
