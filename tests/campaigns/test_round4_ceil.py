"""Round 4, issue 40: many followers at the test engine's full speed against a real server.

The per-token path now wakes only a changed task's followers and sends the events of
one read of the log as one write. Generated (a seeded random walk), on a server whose
engine costs nothing (``LMSP_TEST_ENGINE_DELAY=0``) and writes long answers
(``LMSP_TEST_ENGINE_LENGTH``): streamed creates; background creates followed by several
clients at once through the task's event log (``GET /v1/tasks/{id}/events``), some of
which leave mid-stream and come back with ``Last-Event-ID`` or ``after``; creates
cancelled while followed. Counted as violations:

- a follower's events that are not the log's, in order, from where it started: a gap,
  a repeat, a number out of order, bytes that differ from the stored event;
- a stream of the whole log that ends before its terminal event, or a streamed create
  whose events are not the stored ones it shows (the same JSON, numbers ascending);
- a ``5xx``; a task left unfinished; a data directory that fails the campaigns'
  invariants.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) more steps,
longer answers and more followers.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.campaigns.invariants import Ledger, check, long_run, report, wait_all_finished
from tests.helpers import Server, stored_events

pytestmark = pytest.mark.slow

STEPS = 120 if long_run() else 12
LENGTH = 1000 if long_run() else 200
FOLLOWERS = 8 if long_run() else 4
MODEL = "lmsp-test"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "LMSP_TEST_ENGINE_DELAY": "0",
        "LMSP_TEST_ENGINE_LENGTH": str(LENGTH),
        "LMSP_PARALLEL": "8",
        "LMSP_FLUSH_INTERVAL": "5ms",  # many small commits: many wakes
    }
    srv = Server(tmp_path_factory.mktemp("round4-ceil") / "data", env=env)
    srv.start()
    yield srv
    srv.stop()


def sse_events(lines: Iterator[str]) -> Iterator[tuple[int | None, str]]:
    """``(id, data)`` of each event of a server-sent stream."""
    event_id: int | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield event_id, "\n".join(data)
            event_id, data = None, []
        elif line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            data.append(line[6:])


def stored_log(server: Server, task_id: str) -> dict[int, str]:
    return dict(stored_events(server.data_dir, task_id))


class Follower:
    """One client following a task's whole log, maybe leaving after ``leave_after``
    events and coming back from the last one it saw."""

    def __init__(self, server: Server, task_id: str, leave_after: int | None) -> None:
        self.server, self.task_id, self.leave_after = server, task_id, leave_after
        self.seen: list[tuple[int, str]] = []
        self.errors: list[str] = []
        self.resumed = 0

    def run(self, rng: random.Random) -> None:
        last = -1
        try:
            with self.server.client(timeout=120) as http:
                while True:
                    ended, last = self._once(http, last, rng)
                    if ended:
                        return
                    self.resumed += 1
        except Exception as exc:  # counted: a follower must not fail
            self.errors.append(f"{self.task_id}: {exc!r}")

    def _once(self, http: httpx.Client, last: int, rng: random.Random) -> tuple[bool, int]:
        headers = {"Last-Event-ID": str(last)} if last >= 0 and rng.random() < 0.5 else {}
        params = {} if headers else {"after": last}
        url = f"/v1/tasks/{self.task_id}/events"
        with http.stream("GET", url, params=params, headers=headers) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code} {answer.read()[:200]!r}")
            for n, (seq, data) in enumerate(sse_events(answer.iter_lines())):
                assert seq is not None, data
                self.seen.append((seq, data))
                last = seq
                if json.loads(data)["type"] in TERMINAL:
                    return True, last
                if self.leave_after is not None and n + 1 >= self.leave_after:
                    self.leave_after = None  # leaves once
                    return False, last
        return False, last  # the stream ended early: counted by the caller's check


def follower_violations(log: dict[int, str], follower: Follower) -> list[str]:
    found: list[str] = list(follower.errors)
    numbers = [seq for seq, _ in follower.seen]
    if numbers != list(range(len(numbers))):
        found.append(f"{follower.task_id}: numbers {numbers[:5]}… not 0, 1, 2, … (gap/repeat)")
    for seq, data in follower.seen:
        if log.get(seq) != data:
            found.append(f"{follower.task_id}: event {seq} differs from the stored one")
            break
    if not follower.seen or json.loads(follower.seen[-1][1])["type"] not in TERMINAL:
        found.append(f"{follower.task_id}: the stream ended before the terminal event")
    return found


def streamed_create(server: Server, rng: random.Random) -> tuple[str | None, list[str]]:
    """A streamed create read to its end: its task id and what is wrong with it."""
    body = {"model": MODEL, "input": f"stream {rng.random()}", "stream": True}
    seen: list[tuple[int | None, str]] = []
    with server.client(timeout=120) as http, http.stream("POST", "/v1/responses", json=body) as r:
        if r.status_code != 200:
            return None, [f"streamed create: {r.status_code}"]
        for seq, data in sse_events(r.iter_lines()):
            if data != "[DONE]":
                seen.append((seq, data))
    events = [json.loads(d) for _, d in seen]
    task_id = next((e["response"]["task"]["id"] for e in events if "response" in e), None)
    if task_id is None:
        return None, ["streamed create: no task id"]
    log = stored_log(server, task_id)
    found = []
    numbers = [e["sequence_number"] for e in events]
    if numbers != sorted(set(numbers)):
        found.append(f"{task_id}: streamed numbers not ascending")
    if any(log.get(seq) != data for seq, data in seen):
        found.append(f"{task_id}: a streamed event differs from the stored one")
    if not events or events[-1]["type"] not in TERMINAL:
        found.append(f"{task_id}: the streamed create ended before its terminal event")
    return task_id, found


def followed_create(server: Server, rng: random.Random, cancel: bool) -> tuple[str, list[str]]:
    """A background create followed by several clients at once (some leave and come
    back); ``cancel``: cancelled while they follow."""
    with server.client(timeout=60) as http:
        created = http.post(
            "/v1/responses",
            json={"model": MODEL, "input": f"bg {rng.random()}", "background": True},
        )
        assert created.status_code == 202, created.text
        task_id = created.json()["task"]["id"]
        followers = [
            Follower(server, task_id, rng.choice([None, 1, 3, 10, 40]))
            for _ in range(rng.randint(1, FOLLOWERS))
        ]
        threads = [
            threading.Thread(target=f.run, args=(random.Random(rng.random()),), daemon=True)
            for f in followers
        ]
        for t in threads:
            t.start()
        if cancel:
            answer = http.post(f"/v1/tasks/{task_id}/cancel")
            if answer.status_code >= 500:
                return task_id, [f"cancel: {answer.status_code}"]
    for t in threads:
        t.join(180)
    log = stored_log(server, task_id)
    found = [v for f in followers for v in follower_violations(log, f)]
    if any(t.is_alive() for t in threads):
        found.append(f"{task_id}: a follower still reading after 180 s")
    return task_id, found


def test_followers_at_full_speed_see_exactly_the_log(server: Server) -> None:
    rng = random.Random(40)
    violations: list[str] = []
    counts = {"streamed": 0, "followed": 0, "cancelled": 0}
    lock = threading.Lock()

    def step(seed: float, kind: str) -> None:
        local = random.Random(seed)
        if kind == "streamed":
            _, found = streamed_create(server, local)
        else:
            _, found = followed_create(server, local, cancel=kind == "cancelled")
        with lock:
            counts[kind] += 1
            violations.extend(found)

    kinds = ["streamed", "followed", "followed", "cancelled"]
    for _ in range(STEPS // 4):  # four steps at once: several tasks' commits interleave
        batch = [threading.Thread(target=step, args=(rng.random(), k)) for k in kinds]
        for t in batch:
            t.start()
        for t in batch:
            t.join(300)
    assert wait_all_finished(server.data_dir)
    violations += check(server.data_dir, Ledger())
    report(
        f"round4 ceil: {sum(counts.values())} steps ({counts}), answers of {LENGTH} tokens,"
        f" up to {FOLLOWERS} followers a task, {len(violations)} violations"
    )
    assert violations == [], violations[:10]
