"""The start campaign (issue 40): what ``lmsp serve`` no longer imports at its start is
used first right after a crash, all at once.

Round after round, a real ``lmsp serve`` (the test engine, a word every 0.05 s; a
webhook on a loopback receiver for every event) gets a burst of background tasks of
every ``on_restart`` policy, runs 0.1-1.0 s and is killed with ``kill -9``. As soon as
the relaunched server is healthy — recovering those tasks meanwhile — the first uses of
what it now imports when first needed go in together, from threads of their own: a
webhook's test event (httpx, the client and its TLS context), a response held to a JSON
schema, hostile or not (llguidance checks it; the test engine holds output to none:
always a ``400``, the schema's fault named when llguidance finds one), embeddings in
both encodings (numpy), and an ``lmsp`` command against it (the commands the CLI adds
when named).

Violations: a server that did not come back healthy; a first use that did not work (a
webhook test not ``success``, a schema not refused with a ``400``, embeddings of the
wrong shape, a command that failed); at the end, a task left unfinished, a finished
response whose terminal event never reached the receiver, or a log invariant broken
(:func:`tests.campaigns.invariants.check`).

``make test`` runs 3 rounds; ``make torture`` (``LMSP_CAMPAIGN=long``) 30.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmsp.protocol import webhooks as wire
from tests.campaigns.invariants import Ledger, check, long_run, report
from tests.campaigns.test_round4_reattach import burst, settle
from tests.helpers import Server
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.slow

ROUNDS = 30 if long_run() else 3
TEST_MODEL = "lmsp-test"
TERMINAL = {"response.completed", "response.failed", "response.cancelled", "response.incomplete"}
#: schemas a client may send: nesting, a keyword llguidance cannot hold, a bad type
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "string", "format": "no-such"}}},
    {"type": "nonsense"},
    {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    {
        "type": "object",
        "properties": {"n": json.loads('{"type": "array", "items": ' * 40 + "{}" + "}" * 40)},
    },
]


def first_uses(server: Server, hook: str, rng: random.Random) -> dict[str, Callable[[], str]]:
    """Each first use: a name and a call that says what went wrong ('' if nothing)."""

    def webhook_test() -> str:
        with server.client() as http:
            event = {"event_type": "response.completed"}
            answer = http.post(f"/v1/webhook_endpoints/{hook}/test", json=event)
        if answer.status_code != 200 or not answer.json().get("success"):
            return f"webhook test: {answer.status_code} {answer.text[:200]}"
        return ""

    def schema() -> str:
        body = {
            "model": TEST_MODEL,
            "input": "a hostile schema",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": rng.choice(SCHEMAS)}},
        }
        with server.client() as http:
            answer = http.post("/v1/responses", json=body)
        if answer.status_code != 400:
            return f"schema: {answer.status_code} {answer.text[:200]}"
        return ""

    def embeddings() -> str:
        problems = []
        for encoding in ("float", "base64"):
            body = {"model": TEST_MODEL, "input": ["one", "two words"], "encoding_format": encoding}
            with server.client() as http:
                answer = http.post("/v1/embeddings", json=body)
            if answer.status_code != 200:
                problems.append(
                    f"embeddings ({encoding}): {answer.status_code} {answer.text[:200]}"
                )
                continue
            rows = [row["embedding"] for row in answer.json()["data"]]
            sizes = [
                len(row) if encoding == "float" else len(base64.b64decode(row)) // 4 for row in rows
            ]
            if len(sizes) != 2 or len(set(sizes)) != 1 or not sizes[0]:
                problems.append(f"embeddings ({encoding}): rows of {sizes}")
        return "; ".join(problems)

    def command() -> str:
        name = rng.choice([["ps", "--json"], ["tasks", "ls", "--json"], ["models", "ls", "--json"]])
        done = subprocess.run(
            [sys.executable, "-m", "lmsp", "--url", server.url, "--token", server.token, *name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            return f"lmsp {' '.join(name)}: exit {done.returncode}: {done.stderr[-300:]}"
        return ""

    return {
        "webhook test": webhook_test,
        "schema": schema,
        "embeddings": embeddings,
        "cli": command,
    }


def at_once(uses: dict[str, Callable[[], str]]) -> list[str]:
    problems: list[str] = []
    lock = threading.Lock()

    def run(name: str, use: Callable[[], str]) -> None:
        try:
            problem = use()
        except Exception as exc:  # a dropped connection is a violation too
            problem = f"{name}: {type(exc).__name__}: {exc}"
        if problem:
            with lock:
                problems.append(problem)

    threads = [threading.Thread(target=run, args=item) for item in uses.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return problems


def delivered(receiver: Receiver, ids: set[str], timeout: float = 120) -> list[str]:
    """Each finished response's terminal event reached the receiver."""
    deadline = time.monotonic() + timeout
    while True:
        got = set()
        for delivery in receiver.accepted():
            event = json.loads(delivery.body)
            if event.get("type") in TERMINAL:
                got.add(event["data"]["id"])
        missing = ids - got
        if not missing or time.monotonic() > deadline:
            return [f"no terminal event delivered for {rid}" for rid in sorted(missing)]
        time.sleep(0.1)


def test_start_campaign(tmp_path: Path) -> None:
    seed = int(os.environ.get("LMSP_START_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    env = {"LMSP_TEST_ENGINE_DELAY": "0.05", "LMSP_WEBHOOK_RETRY": "0.2s"}
    receiver = Receiver().start()
    server = Server(tmp_path / "data", env=env)
    ledger = Ledger()
    violations: list[str] = []
    outcomes: Counter[str] = Counter()
    try:
        server.start()
        with server.client() as http:
            answer = http.post(
                "/v1/webhooks", json={"url": receiver.url, "events": list(wire.EVENTS)}
            )
            assert answer.status_code == 201, answer.text
            hook = answer.json()["id"]
        for _ in range(ROUNDS):
            burst(server, rng, ledger)
            time.sleep(rng.uniform(0.1, 1.0))
            server.kill()
            try:
                server.start()
            except RuntimeError as exc:
                violations.append(f"no healthy relaunch: {exc}")
                break
            problems = at_once(first_uses(server, hook, rng))
            violations += problems
            outcomes["clean" if not problems else "violations"] += 1
        unfinished, ids = settle(server, ledger)
        violations += unfinished
        violations += delivered(receiver, ids)
        server.stop()
        violations += check(server.data_dir, ledger)
    finally:
        server.stop()
        receiver.stop()
    report(
        f"start campaign (seed {seed}): {ROUNDS} kills, {len(ledger.accepted)} tasks,"
        f" {len(receiver.received())} deliveries, rounds {dict(outcomes)},"
        f" {len(violations)} violations"
    )
    assert not violations, violations[:10]
