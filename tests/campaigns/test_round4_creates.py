"""Round 4, issue 40's creates: fewer writer jobs a create, its model's record cached.

A fresh task whose model is loaded is claimed and started in one writer job, a batch of
output the writer has not begun joins the next write (the terminal one included), and
the model record a create resolves is kept in the API process, checked in the create's
transaction. Generated (a seeded random walk) against a real server at the test
engine's full speed (``LMSP_TEST_ENGINE_DELAY=0``), several clients at once:

- background creates by a model's id and by an alias, some cancelled at once (a cancel
  racing the claim-and-start and the taken-back batch), some with an Idempotency-Key
  sent twice;
- meanwhile the model's defaults changed (a temperature drawn each time) and the alias
  removed and set again.

Counted as violations: a ``5xx``; a ``409`` (the model changed under each of the
create's tries: sent again by a client, nothing written) with fewer changes during the
create than it tries; a create answered ``202`` while its alias was
removed for the whole of its request (before its send, after its answer), or ``404``
while it was set for the whole of it; a response whose temperature is none that the
model's defaults held during its create (from the value before its send to the last
set before its answer); a task left unfinished; a data directory that fails the
campaigns' invariants (gap-free logs from 0, one terminal event, deltas equal to the
output, keys answered once).

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) more steps.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from lmsp.app.service import TRIES
from tests.campaigns.invariants import Ledger, check, long_run, report, wait_all_finished
from tests.helpers import Server

pytestmark = pytest.mark.slow

STEPS = 1200 if long_run() else 120
CLIENTS = 8
MODEL = "lmsp-test"
ALIAS = "round4-creates"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_PARALLEL": "4", "LMSP_MAX_QUEUE": "100000"}
    srv = Server(tmp_path_factory.mktemp("round4-creates") / "data", env=env)
    srv.start()
    yield srv
    srv.stop()


class Model:
    """What the test set on the model: every temperature its defaults held and whether
    the alias was set, each change numbered, so that a create can be judged by the
    changes made during it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.temperatures: list[float] = [1.0]  # change n: what the defaults held after
        self.alias: list[bool] = [False]
        self.answered = [0, 0]  # the last change of each answered (a change is sent
        # after it is appended: until its answer, the one before may still hold)

    def since(self) -> tuple[int, int]:
        """Where a create sent now starts: the last changes answered."""
        with self.lock:
            return self.answered[0], self.answered[1]

    def until(self) -> tuple[int, int]:
        """Where a create answered now ends: the last changes sent."""
        with self.lock:
            return len(self.temperatures) - 1, len(self.alias) - 1


def changer(server: Server, model: Model, stop: threading.Event, rng: random.Random) -> list[str]:
    found: list[str] = []
    with server.client(timeout=60) as http:
        while not stop.is_set():
            if rng.random() < 0.5:
                value = round(rng.uniform(0.05, 1.95), 2)
                # noted as possible before the change is sent: a create may see it at once
                with model.lock:
                    model.temperatures.append(value)
                answer = http.patch(
                    f"/v1/models/{MODEL}", json={"defaults": {"temperature": value}}
                )
            else:
                with model.lock:
                    setting = not model.alias[-1]
                    model.alias.append(setting)
                if setting:
                    answer = http.put(f"/v1/model_aliases/{ALIAS}", json={"model": MODEL})
                else:
                    answer = http.delete(f"/v1/model_aliases/{ALIAS}")
            if answer.status_code != 200:
                found.append(f"change: {answer.status_code} {answer.text[:120]}")
            with model.lock:
                model.answered = [len(model.temperatures) - 1, len(model.alias) - 1]
            stop.wait(rng.uniform(0.0, 0.05))
    return found


def create(
    http: httpx.Client, model: Model, ledger: Ledger, rng: random.Random, counts: dict[str, int]
) -> list[str]:
    by_alias = rng.random() < 0.5
    body: dict[str, Any] = {
        "model": ALIAS if by_alias else MODEL,
        "input": f"creates {uuid.uuid4().hex}",
        "background": True,
    }
    key = uuid.uuid4().hex if rng.random() < 0.2 else None
    headers = {"Idempotency-Key": key} if key else {}
    t0, a0 = model.since()
    answer = http.post("/v1/responses", json=body, headers=headers)
    t1, a1 = model.until()
    if answer.status_code >= 500:
        return [f"create: {answer.status_code} {answer.text[:120]}"]
    with model.lock:
        aliases = model.alias[a0 : a1 + 1]
        temperatures = model.temperatures[t0 : t1 + 1]
    found: list[str] = []
    if answer.status_code == 404:
        counts["404"] += 1
        if not by_alias or all(aliases):
            found.append(f"404 while the alias was set throughout: {answer.text[:120]}")
        return found
    if answer.status_code == 409 and answer.json()["error"]["code"] == "conflict":
        # the model's record changed under each of the create's tries (a machine whose
        # cores are busy makes a try slow): refused, to be sent again, nothing written
        changed = (t1 - t0) + (a1 - a0)
        if changed < TRIES:
            return [f"409 with {changed} changes during the create: {answer.text[:120]}"]
        ledger.refuse(body)
        counts["409"] += 1
        return found
    if answer.status_code != 202:
        return [f"create: {answer.status_code} {answer.text[:120]}"]
    obj = answer.json()
    ledger.accept(obj, body, key)
    counts["created"] += 1
    if by_alias and not any(aliases):
        found.append(f"{obj['id']}: 202 by an alias removed throughout")
    if obj["temperature"] not in temperatures:
        found.append(f"{obj['id']}: temperature {obj['temperature']} not one of {temperatures}")
    if key is not None:  # the same key again: the same response
        again = http.post("/v1/responses", json=body, headers=headers)
        if again.status_code == 202 and again.json()["id"] != obj["id"]:
            found.append(f"{obj['id']}: its key answered {again.json()['id']}")
        elif again.status_code >= 500:
            found.append(f"replay: {again.status_code}")
    if rng.random() < 0.3:
        counts["cancelled"] += 1
        cancel = http.post(f"/v1/responses/{obj['id']}/cancel")
        if cancel.status_code >= 500:
            found.append(f"cancel: {cancel.status_code}")
    return found


def test_creates_racing_model_changes_and_cancels(server: Server) -> None:
    rng = random.Random(4044)
    model, ledger = Model(), Ledger()
    counts = {"created": 0, "404": 0, "409": 0, "cancelled": 0}
    violations: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    changes: list[str] = []
    change_thread = threading.Thread(
        target=lambda: changes.extend(changer(server, model, stop, random.Random(rng.random())))
    )
    change_thread.start()

    def client(seed: float, steps: int) -> None:
        local = random.Random(seed)
        with server.client(timeout=120) as http:
            for _ in range(steps):
                local_counts = {"created": 0, "404": 0, "409": 0, "cancelled": 0}
                found = create(http, model, ledger, local, local_counts)
                with lock:
                    violations.extend(found)
                    for name, n in local_counts.items():
                        counts[name] += n

    threads = [
        threading.Thread(target=client, args=(rng.random(), STEPS // CLIENTS))
        for _ in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    stop.set()
    change_thread.join(60)
    violations += changes
    if not wait_all_finished(server.data_dir):
        violations.append("tasks left unfinished")
    violations += check(server.data_dir, ledger)
    report(
        f"round4 creates: {sum(counts.values())} outcomes ({counts}),"
        f" {len(model.temperatures) - 1} default changes, {len(model.alias) - 1} alias changes,"
        f" {len(violations)} violations"
    )
    assert violations == [], violations[:10]
