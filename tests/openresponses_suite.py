"""The Open Responses compliance suite (TypeScript, run with Bun), installed once into a
cache directory: ``.ci/run`` runs ``python -m tests.openresponses_suite`` before ``make
test``, so nothing is downloaded while the tests run.

Two checkouts of the upstream repository are made: the current suite at
:data:`CURRENT` (17 tests, the WebSocket ones among them), and the older one at
:data:`OLDER` (its ``file-input`` test), whose two suite files are laid over the current
checkout as they were then (their imports all exist there). Bun comes from npm (its
binary is a registry package), pinned as the suite's ``.tool-versions`` pins it; the
suite's own packages are installed with ``bun install`` from its lockfile.

Without the cache the tests that need it skip, saying why — unless
``LMSP_REQUIRE_OPENRESPONSES=1`` (CI, set by ``.ci/run``), where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = os.environ.get("LMSP_REQUIRE_OPENRESPONSES") == "1"
#: the suite with WebSocket mode and ``phase`` (2026-07-15, "spec-versioning" merged)
CURRENT = "92c12d96d7b61d6d15e2214daa5e9c6000ab6e1c"
#: the suite with ``file-input`` (its PDF has no xref table and a wrong ``/Length``)
OLDER = "18e565604fdf7a08ad3a06bbc30d1ddaee999ea4"
OLDER_FILES = ("src/lib/compliance-tests.ts", "bin/compliance-test.ts")
BUN = "bun@1.3.12"
SOURCE = os.environ.get(
    "LMSP_OPENRESPONSES_GIT", "https://github.com/openresponses/openresponses.git"
)
CACHE = Path(
    os.environ.get(
        "LMSP_OPENRESPONSES_CACHE", Path.home() / ".cache" / "lmsp-tests" / "openresponses"
    )
)
STAMP = f"{CURRENT} {OLDER} {BUN}"


def _missing(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"{why} (LMSP_REQUIRE_OPENRESPONSES=1)")
    pytest.skip(f"{why}; run `python -m tests.openresponses_suite` (needs git, npm)")


def located() -> tuple[Path, Path, Path]:
    """``(bun, current checkout, older checkout)``, installed by :func:`install`."""
    stamp = CACHE / "installed"
    bun = CACHE / "tools" / "node_modules" / ".bin" / "bun"
    if not stamp.exists() or stamp.read_text() != STAMP or not bun.exists():
        _missing(f"the Open Responses suite is not in {CACHE}")
    return bun, CACHE / "current", CACHE / "older"


def _run(*command: str | Path, cwd: Path | None = None) -> bytes:
    env = dict(os.environ, PATH=f"{CACHE / 'tools' / 'node_modules' / '.bin'}:{os.environ['PATH']}")
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return done.stdout


def install() -> None:
    """Bun from npm, the repository, both checkouts and their packages (idempotent)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if (CACHE / "installed").exists() and (CACHE / "installed").read_text() == STAMP:
        return
    tools = CACHE / "tools"
    tools.mkdir(exist_ok=True)
    _run("npm", "install", "--prefix", tools, "--no-save", BUN)
    repo = CACHE / "repo.git"
    if not repo.exists():
        _run("git", "clone", "--bare", SOURCE, repo)
    for name in ("current", "older"):
        shutil.rmtree(CACHE / name, ignore_errors=True)
        (CACHE / name).mkdir()
        archive = _run("git", "--git-dir", repo, "archive", CURRENT)
        subprocess.run(["tar", "-x", "-C", CACHE / name], input=archive, check=True)
    for path in OLDER_FILES:
        (CACHE / "older" / path).write_bytes(
            _run("git", "--git-dir", repo, "show", f"{OLDER}:{path}")
        )
    for name in ("current", "older"):
        _run("bun", "install", "--frozen-lockfile", "--ignore-scripts", cwd=CACHE / name)
    (CACHE / "installed").write_text(STAMP)


if __name__ == "__main__":
    install()
    print(f"the Open Responses suite is in {CACHE}", file=sys.stderr)
