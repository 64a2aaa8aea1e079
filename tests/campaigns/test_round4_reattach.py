"""The reattach campaign (issue 40): engines that outlive a crash of the API process
(``LMSP_ENGINE_ORPHAN_TIMEOUT``) under ``kill -9`` again and again, with hostile leases.

Round after round, a real ``lmsp serve`` (the test engine, a word every 0.05 s) gets a
random burst of background tasks of every ``on_restart`` policy, runs 0.2-1.2 s and is
killed with ``kill -9``. Before the relaunch, one of: nothing (the engine must be
reattached: the same process id), the orphaned engine killed too (a stale lease: a new
engine), the lease replaced by garbage, or the lease's nonce changed (the engine cannot
prove the key: a new engine, and the old one, not reattached, is killed by the test).

Violations: an engine that died with its API process; a relaunch that did not reattach
to a living, untouched engine, or that reattached to one it must not have; a server
that did not come back healthy; at the end, a task left unfinished, a log invariant
broken (:func:`tests.campaigns.invariants.check`), or an engine or lease left behind by a
normal stop.

``make test`` runs 4 rounds; ``make torture`` (``LMSP_CAMPAIGN=long``) 40.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.campaigns.invariants import Ledger, check, long_run, report
from tests.helpers import Server, exited, wait_exited

pytestmark = pytest.mark.slow

ROUNDS = 40 if long_run() else 4
TEST_MODEL = "lmsp-test"
HOSTILE = ("none", "none", "stale", "garbage", "nonce")


def engine_pid(http: httpx.Client) -> int | None:
    found = [e for e in http.get("/healthz").json()["engines"] if e["model"] == TEST_MODEL]
    if found and found[0].get("state") == "ready" and found[0].get("pid"):
        return int(found[0]["pid"])
    return None


def wait_pid(server: Server, timeout: float = 120) -> int | None:
    deadline = time.monotonic() + timeout
    with server.client() as http:
        while time.monotonic() < deadline:
            pid = engine_pid(http)
            if pid is not None:
                return pid
            time.sleep(0.05)
    return None


def burst(server: Server, rng: random.Random, ledger: Ledger) -> None:
    with server.client() as http:
        for _ in range(rng.randint(2, 8)):
            body: dict[str, Any] = {
                "model": TEST_MODEL,
                "input": f"round word {rng.random()}",
                "background": True,
                "on_restart": rng.choice(["resume", "retry", "fail"]),
                "seed": rng.randint(0, 1000),
            }
            answer = http.post("/v1/responses", json=body)
            if answer.status_code == 202:
                ledger.accept(answer.json(), body, None)


def tamper(data_dir: Path, how: str, pid: int | None) -> bool:
    """Spoil the lease as ``how`` says; whether the engine may still be reattached."""
    leases = sorted((data_dir / "engines").glob("*.json"))
    if how == "none" or not leases:
        return True
    if how == "stale" and pid is not None:
        os.kill(pid, signal.SIGKILL)
        wait_exited(pid)
    elif how == "garbage":
        leases[0].write_bytes(os.urandom(64))
    elif how == "nonce":
        lease = json.loads(leases[0].read_text())
        lease["nonce"] = "0" * 32
        leases[0].write_text(json.dumps(lease))
    return False


def settle(server: Server, ledger: Ledger, timeout: float = 300) -> tuple[list[str], set[str]]:
    """Every accepted task finished: the violations, and the ids of the responses."""
    deadline = time.monotonic() + timeout
    ids: set[str] = set()
    with server.client() as http:
        for acc in list(ledger.accepted.values()):
            while http.get(f"/v1/responses/{acc.response_id}").json()["status"] in (
                "queued",
                "in_progress",
            ):
                if time.monotonic() > deadline:
                    return [f"{acc.response_id} unfinished after {timeout:.0f} s"], ids
                time.sleep(0.05)
            ids.add(acc.response_id)
    return [], ids


def test_reattach_campaign(tmp_path: Path) -> None:
    seed = int(os.environ.get("LMSP_REATTACH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    env = {"LMSP_ENGINE_ORPHAN_TIMEOUT": "60s", "LMSP_TEST_ENGINE_DELAY": "0.05"}
    server = Server(tmp_path / "data", env=env)
    ledger = Ledger()
    violations: list[str] = []
    outcomes: Counter[str] = Counter()
    leftovers: list[int] = []  # engines not reattached on purpose: the test ends them
    try:
        server.start()
        for _ in range(ROUNDS):
            burst(server, rng, ledger)
            time.sleep(rng.uniform(0.2, 1.2))
            before = wait_pid(server)
            server.kill()
            if before is not None and exited(before):
                violations.append(f"engine {before} died with its API process")
            how = rng.choice(HOSTILE)
            may = tamper(server.data_dir, how, before)
            try:
                server.start()
            except RuntimeError as exc:
                violations.append(f"no healthy relaunch after {how}: {exc}")
                break
            burst(server, rng, ledger)  # a task makes sure the engine is wanted
            after = wait_pid(server)
            if before is None or after is None:
                outcomes["no engine seen"] += 1
                continue
            if may and after != before:
                violations.append(f"round {how}: {before} alive but not reattached")
            if not may and after == before:
                violations.append(f"round {how}: {before} reattached against its lease")
            if not may and not exited(before):
                leftovers.append(before)
            outcomes["reattached" if after == before else f"new engine ({how})"] += 1
        violations += settle(server, ledger)[0]
        last = wait_pid(server)
        server.stop()
        if last is not None and not wait_exited(last, 30):
            violations.append(f"engine {last} outlived a normal stop")
        if list((server.data_dir / "engines").glob("*.json")):
            violations.append("a lease outlived a normal stop")
        violations += check(server.data_dir, ledger)
    finally:
        server.stop()
        for pid in leftovers:
            if not exited(pid):
                os.kill(pid, signal.SIGKILL)
    report(
        f"reattach campaign (seed {seed}): {ROUNDS} kills, {len(ledger.accepted)} tasks,"
        f" {dict(outcomes)}, {len(violations)} violations"
    )
    assert not violations, violations[:10]
