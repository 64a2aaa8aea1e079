"""The Open Responses compliance suite, run as a new user runs it (``bun run
bin/compliance-test.ts --base-url … --api-key … --model …``), against a real ``lmsp
serve`` with the bundled model (issue 39).

- The current suite (:data:`tests.openresponses_suite.CURRENT`, 17 tests): all pass but
  ``image-input`` (a text-only model: ``400 unsupported_input``) and ``tool-calling``
  (under ``tool_choice: "auto"`` the 135M model may answer without a call; forced, it
  calls: ``tests/test_tools_sdk.py``). Before: 7 of 17 (every WebSocket test refused
  at the upgrade, ``phase`` refused).
- The older suite (:data:`tests.openresponses_suite.OLDER`, 9 tests run): its
  ``file-input`` passes (its PDF has no xref table: ``invalid_file`` before), and all
  but the same two (measured on a quiet machine, 2026-12-05: 15 of 17 in 18.7 s, all at
  once; the older 7 of 9, ``tool-calling`` under ``auto`` failing as the model chose).

The suite starts all its tests at once and gives a WebSocket turn 30 s; on a loaded
2-core machine the bundled model can take longer. A test that failed only by a client
timeout is therefore run again alone (``--filter``, up to :data:`RETRIES` times); any
other failure fails here. Both counts are printed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import openresponses_suite
from tests.helpers import Server, served

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
#: what the bundled model cannot do (not the protocol)
MODEL_LIMITS = {"image-input", "tool-calling"}
#: how many times a test that failed only by a client timeout is run again alone
RETRIES = 3
#: what the suite says when its client gave up waiting (never a protocol failure)
TIMEOUTS = ("Timed out waiting", "The operation timed out", "timed out")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    openresponses_suite.located()  # skip (or fail in CI) before starting a server
    with served(tmp_path_factory.mktemp("suite") / "data") as srv:
        yield srv


def run_suite(
    server: Server, checkout: Path, only: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    bun, _, _ = openresponses_suite.located()
    command = [str(bun), "run", "bin/compliance-test.ts", "--base-url", f"{server.url}/v1"]
    command += ["--api-key", server.token, "--model", MODEL, "--json"]
    if only:
        command += ["--filter", ",".join(only)]
    ran = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=1800)
    if "{" not in ran.stdout:  # the older runner dies when one of its fetches times out
        return {"(the run)": {"status": "failed", "errors": [ran.stderr[-3000:]]}}
    report = json.loads(ran.stdout[ran.stdout.index("{") :])
    return {result["id"]: result for result in report["results"]}


def timed_out(result: dict[str, Any]) -> bool:
    errors = result.get("errors") or []
    return bool(errors) and any(any(t in e for t in TIMEOUTS) for e in errors)


def passing(server: Server, checkout: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """Every test's result after the timeout-only failures ran again alone, and how
    many passed in the first run (all at once, as a user runs it)."""
    results = run_suite(server, checkout)
    for _ in range(RETRIES):  # a run that died of a client timeout, again
        if "(the run)" not in results or not timed_out(results["(the run)"]):
            break
        results = run_suite(server, checkout)
    at_once = sum(r["status"] == "passed" for r in results.values())
    for test_id in sorted(results):
        for _ in range(RETRIES):
            if results[test_id]["status"] != "failed" or not timed_out(results[test_id]):
                break
            results[test_id] = run_suite(server, checkout, [test_id])[test_id]
    return results, at_once


def check(results: dict[str, dict[str, Any]], at_once: int, name: str) -> list[str]:
    results = {i: r for i, r in results.items() if r["status"] != "skipped"}  # optional
    passed = sorted(i for i, r in results.items() if r["status"] == "passed")
    failed = {i: r.get("errors") for i, r in results.items() if r["status"] == "failed"}
    print(
        f"\n{name}: {at_once} of {len(results)} passed run at once; {len(passed)} of"
        f" {len(results)} with timed-out tests run again alone; failed: {sorted(failed)}"
    )
    unexpected = {i: e for i, e in failed.items() if i not in MODEL_LIMITS}
    assert not unexpected, json.dumps(unexpected, indent=1)[:4000]
    if "image-input" in failed:  # refused as a text-only model refuses images
        assert "unsupported_input" in json.dumps(results["image-input"].get("response"))
    return passed


@pytest.mark.timeout(3600)  # the suite, and timed-out tests again, on a shared machine
def test_the_current_suite_passes_but_what_the_model_cannot_do(server: Server) -> None:
    _, current, _ = openresponses_suite.located()
    results, at_once = passing(server, current)
    assert len(results) == 17
    passed = check(results, at_once, "current suite")
    assert len(passed) >= 15
    assert {i for i in results if i.startswith("websocket-")} <= set(passed)
    assert "assistant-phase" in passed


@pytest.mark.timeout(3600)
def test_the_older_suite_reads_its_damaged_pdf(server: Server) -> None:
    _, _, older = openresponses_suite.located()
    results, at_once = passing(server, older)
    passed = check(results, at_once, "older suite")
    assert sum(r["status"] != "skipped" for r in results.values()) == 9
    assert "file-input" in passed and len(passed) >= 7  # 8 when the model calls its tool
