"""``lmsp serve`` imports at its start only what serving needs (issue 40: a restart after
a crash is the API process's own start): the libraries that only some requests, some
models or the other commands use are imported when first used.

A real ``lmsp serve`` is killed (``kill -9``) while an ``on_restart: resume`` task of the
test engine runs; the relaunched ``lmsp serve`` recovers it, with a watcher thread in
its process that writes the modules loaded once ``/healthz`` first answers 200 (the
first start, which registers the bundled model, is not measured). bench/start.py
measures the time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import Server, free_port

#: imported at start before issue 40's start work; none is needed to serve
LAZY = (
    "numpy",  # embeddings, engines' sampling: the engine process, or a request
    "llguidance",  # a JSON schema or tools held to a grammar
    "standardwebhooks",  # a webhook's signature
    "httpx",  # a webhook's try, a pull, an MCP call, a remote model (and its TLS context)
    "httpcore",
    "rich",  # the command's tables (httpx imports its own command line, and rich with it)
    "webbrowser",  # `lmsp console`
    "lmsp.cli.doctor",  # the other commands
    "lmsp.cli.ps",
    "lmsp.cli.models",
    "lmsp.client",
)
#: never imported at start (a guard against their coming back)
NEVER = (
    "llama_cpp",
    "mcp",
    "pypdf",
    "pikepdf",
    "tokenizers",
    "huggingface_hub",
    "playwright",
    "schemathesis",
    "transformers",
)

WATCHER = """
import json, os, sys, threading, time, urllib.request

def watch(url, out):
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    break
        except OSError:
            time.sleep(0.02)
    with open(out + ".part", "w") as f:
        json.dump(sorted(sys.modules), f)
    os.replace(out + ".part", out)

threading.Thread(target=watch, args=(sys.argv[1], sys.argv[2]), daemon=True).start()
from lmsp.cli import main
main(["serve"], prog_name="lmsp")
"""


def interrupted(data: Path, env: dict[str, str]) -> None:
    """A server on ``data`` killed while its resumable task runs."""
    server = Server(data, env=env).start()
    try:
        with server.client() as http:
            body = {"model": "lmsp-test", "input": "a long story", "background": True}
            rid = http.post("/v1/responses", json=body | {"on_restart": "resume"}).json()["id"]
            for _ in range(600):
                if http.get(f"/v1/responses/{rid}").json().get("output"):
                    break
                time.sleep(0.05)
    finally:
        server.kill()


def test_serve_starts_without_what_only_some_requests_need(tmp_path: Path) -> None:
    slow = {"LMSP_TEST_ENGINE_DELAY": "0.05", "LMSP_TEST_ENGINE_LENGTH": "100000"}
    interrupted(tmp_path / "data", slow)
    port = free_port()
    out = tmp_path / "modules.json"
    env = dict(
        os.environ,
        LMSP_DATA_DIR=str(tmp_path / "data"),
        LMSP_PORT=str(port),
        LMSP_HOST="127.0.0.1",
        LMSP_ENABLE_TEST_ENGINE="1",
        **slow,
    )
    url = f"http://127.0.0.1:{port}/healthz"
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", WATCHER, url, str(out)], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), log.read_text()[-3000:]
        loaded = set(json.loads(out.read_text()))
    finally:
        proc.terminate()
        proc.wait(30)
    assert "lmsp.api.app" in loaded  # the watcher saw a started service
    assert "recovered: 0 failed, 0 cancelled, 0 requeued, 1 resumed" in log.read_text()
    tops = {name.split(".")[0] for name in loaded}
    early = [m for m in LAZY + NEVER if m in loaded or m in tops]
    assert early == [], f"imported at start: {', '.join(early)}"
