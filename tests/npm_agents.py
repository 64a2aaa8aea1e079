"""The npm agents (Codex CLI, Claude Code), installed once into a cache directory.

``npm install -g --prefix CACHE`` runs at most once per test session (and not at all
while the cache holds the pinned versions). Without node/npm the tests that need them
skip, saying why — unless ``LMSP_REQUIRE_AGENTS=1`` (CI, set by ``.ci/run``), where they
fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REQUIRED = os.environ.get("LMSP_REQUIRE_AGENTS") == "1"
#: the versions the tests were written against (their default request shapes differ)
CODEX = "@openai/codex@0.171.0"
CLAUDE = "@anthropic-ai/claude-code@2.1.197"
#: the model Codex CLI 0.171 asks for when its config names none
CODEX_DEFAULT_MODEL = "gpt-6.2-sol"
CACHE = Path(
    os.environ.get("LMSP_AGENTS_CACHE", Path.home() / ".cache" / "lmsp-tests" / "npm-agents")
)


def _missing(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"{why} (LMSP_REQUIRE_AGENTS=1)")
    pytest.skip(f"{why}; set LMSP_REQUIRE_AGENTS=1 to fail instead")


def install() -> Path:
    """The ``bin`` directory holding ``codex`` and ``claude`` (installed if needed)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        _missing("node and npm are not installed (Debian: apt-get install nodejs npm)")
    stamp = CACHE / "installed"
    bin_dir = CACHE / "bin"
    wanted = f"{CODEX} {CLAUDE}"
    if stamp.exists() and stamp.read_text() == wanted and (bin_dir / "codex").exists():
        return bin_dir
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["npm", "install", "-g", "--prefix", str(CACHE), CODEX, CLAUDE],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0 or not (bin_dir / "claude").exists():
        _missing(f"npm could not install the agents: {done.stderr[-2000:]}")
    stamp.write_text(wanted)
    return bin_dir
