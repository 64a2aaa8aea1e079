"""``kill -9`` at random moments: nothing accepted is lost, every log stays whole, and
startup recovery applies the table of chapter 11.3 after each crash.

The server is a real ``lmsp serve`` subprocess with the deterministic test engine; the
kill is ``SIGKILL``, so no shutdown code runs. The database is read directly between
runs (and, read-only, while the server runs) to check what was committed.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.helpers import Server, check_log_invariants, message_text, open_db, task_log

pytestmark = pytest.mark.slow

POLICIES = ("fail", "retry", "resume")
TOKENS = 24  # the test engine's answer length
RESPONSE_STATUS = {"completed": "completed", "failed": "failed", "cancelled": "cancelled"}


@dataclass
class Sent:
    """A request that got its ``202``."""

    response_id: str
    task_id: str
    body: dict[str, Any]
    cancel_answer: str | None = None  # task status in the answer to our cancel, if any


@dataclass
class Leftover:
    """An unfinished task as the database held it right after a kill."""

    task_id: str
    status: str
    policy: str
    last_seq: int
    attempt: int


@dataclass
class Campaign:
    server: Server
    rng: random.Random
    sent: dict[str, Sent] = field(default_factory=dict)
    leftovers: list[Leftover] = field(default_factory=list)  # over all kills
    last_kill: list[Leftover] = field(default_factory=list)  # unfinished at the last kill
    recovered: dict[str, int] = field(default_factory=dict)  # what recovery did, by kind
    counter: int = 0

    @property
    def data_dir(self) -> Path:
        return self.server.data_dir

    def body(self) -> dict[str, Any]:
        n = self.counter
        self.counter += 1
        body: dict[str, Any] = {
            "model": "lmsp-test",
            "input": f"crash test request number {n}",
            "background": True,
            "seed": self.rng.randrange(1, 2**31),
            "on_restart": POLICIES[n % 3],
        }
        if n % 4 == 1:
            body["temperature"] = 0.7
        return body

    def post(self, client: httpx.Client) -> Sent:
        body = self.body()
        answer = client.post("/v1/responses", json=body)
        assert answer.status_code == 202, answer.text
        obj = answer.json()
        assert obj["status"] == "queued"
        assert answer.headers["location"] == f"/v1/responses/{obj['id']}"
        sent = Sent(obj["id"], obj["task"]["id"], body)
        self.sent[sent.task_id] = sent
        return sent

    def cancel_one(self, client: httpx.Client) -> None:
        sent = self.rng.choice(list(self.sent.values()))
        if sent.cancel_answer is not None:
            return
        answer = client.post(f"/v1/responses/{sent.response_id}/cancel")
        assert answer.status_code == 200, answer.text
        sent.cancel_answer = answer.json()["task"]["status"]

    # -- after a kill, before the restart --------------------------------------------------
    def after_kill(self) -> list[Leftover]:
        """Every ``202`` is in the database; the logs are whole; note what was unfinished."""
        conn = open_db(self.data_dir)
        try:
            tasks = {r["id"]: r for r in conn.execute("SELECT * FROM tasks")}
            responses = {r[0] for r in conn.execute("SELECT id FROM responses")}
            for sent in self.sent.values():
                assert sent.task_id in tasks, f"accepted {sent.task_id} lost in a crash"
                assert sent.response_id in responses
            check_log_invariants(conn)
        finally:
            conn.close()
        found = [
            Leftover(t["id"], t["status"], t["on_restart"], t["last_sequence_number"], t["attempt"])
            for t in tasks.values()
            if t["status"] in ("queued", "loading", "running", "cancelling")
        ]
        self.leftovers.extend(found)
        self.last_kill = found
        return found

    # -- after the restart (healthz answers only once recovery has run) --------------------
    def check_recovery(self) -> None:
        """The first event after each leftover's last one is the table's (11.3)."""
        conn = open_db(self.data_dir)
        try:
            for lo in self.last_kill:
                log = task_log(conn, lo.task_id)
                nxt = log[lo.last_seq + 1] if len(log) > lo.last_seq + 1 else None
                kind = recovery_kind(lo)
                self.recovered[kind] = self.recovered.get(kind, 0) + 1
                check_first_event_after_restart(lo, kind, nxt)
        finally:
            conn.close()


def recovery_kind(lo: Leftover) -> str:
    """The cell of the 11.3 table a leftover falls in."""
    if lo.status == "cancelling":
        return "cancelled"
    if lo.policy == "fail":
        return "failed"
    if lo.status == "queued":
        return "kept_queued"
    if lo.status == "running" and lo.policy == "resume":
        return "resumed"
    return "requeued_reset" if lo.policy == "retry" else "requeued"


def check_first_event_after_restart(lo: Leftover, kind: str, nxt: dict[str, Any] | None) -> None:
    where = (lo, nxt and nxt["type"])
    if kind == "cancelled":
        assert nxt is not None and nxt["type"] == "response.cancelled", where
    elif kind == "failed":
        assert nxt is not None and nxt["type"] == "response.failed", where
        assert nxt["response"]["error"]["code"] == "server_restarted"
    elif kind in ("requeued", "requeued_reset"):
        assert nxt is not None and nxt["type"] == "response.queued", where
        assert nxt["attempt"] == lo.attempt + 1
        assert nxt.get("reset", False) is (kind == "requeued_reset")
    elif kind == "resumed":
        # written by the runner when it picks the task up again, so maybe not yet
        if nxt is not None:
            assert nxt["type"] == "response.in_progress" and nxt["resumed"] is True, where
            assert nxt["response"]["task"]["attempt"] == lo.attempt
    else:
        # queued → queued writes no event; the next one, if any, is the runner's claim
        if nxt is not None:
            assert nxt["type"] == "response.loading", where
            assert nxt["response"]["task"]["attempt"] == lo.attempt


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll until ``condition`` holds (a wait; time is never what is asserted)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def running_with_tokens(data_dir: Path, policy: str, at_least: int) -> str | None:
    """A running task of ``policy`` whose snapshot holds ``at_least`` tokens (not near its
    end), or ``None``."""
    conn = sqlite3.connect(str(data_dir / "lmsp.db"), timeout=30)
    try:
        rows = conn.execute(
            "SELECT id, snapshot FROM tasks WHERE status = 'running' AND on_restart = ?",
            (policy,),
        ).fetchall()
    finally:
        conn.close()
    for task_id, snapshot in rows:
        done = int(json.loads(snapshot)["token_count"]) if snapshot else 0  # tokens stored
        if at_least <= done <= TOKENS - 8:
            return str(task_id)
    return None


def kill_mid_generation(campaign: Campaign, client: httpx.Client, policy: str) -> None:
    """Kill once a ``policy`` task is part-way through its text (a random number of
    tokens in); it must be found ``running`` afterwards."""
    for _ in range(6):
        campaign.post(client)
    campaign.cancel_one(client)
    at_least = campaign.rng.randint(1, 12)
    target: list[str] = []

    def mid_flight() -> bool:
        found = running_with_tokens(campaign.data_dir, policy, at_least)
        if found is not None:
            target.append(found)
        return found is not None

    wait_for(mid_flight, f"a running {policy} task")
    campaign.server.kill()
    left = {lo.task_id: lo for lo in campaign.after_kill()}
    assert left[target[0]].status == "running"


def kill_right_after_202(campaign: Campaign, client: httpx.Client) -> None:
    """Cancel a task mid-text (it is likely still ``cancelling`` at the kill), post once
    more, and kill as soon as that 202 is in."""
    for _ in range(4):
        campaign.post(client)
    target: list[str] = []

    def mid_flight() -> bool:
        found = [running_with_tokens(campaign.data_dir, p, 1) for p in POLICIES]
        target.extend(f for f in found if f is not None and f in campaign.sent)
        return bool(target)

    wait_for(mid_flight, "a running task")
    sent = campaign.sent[target[0]]
    answer = client.post(f"/v1/responses/{sent.response_id}/cancel")
    assert answer.status_code == 200, answer.text
    sent.cancel_answer = answer.json()["task"]["status"]
    last = campaign.post(client)
    campaign.server.kill()  # nothing between the 202 and the kill
    left = {lo.task_id: lo for lo in campaign.after_kill()}
    assert left[last.task_id].status == "queued"


def kill_during_posts(campaign: Campaign) -> None:
    """A client keeps posting; the kill lands after a random number of 202s, very likely
    with a request in flight. Whatever got a 202 must survive."""
    goal = campaign.rng.randint(2, 6)
    accepted = threading.Semaphore(0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def post_loop() -> None:
        with campaign.server.client(timeout=10) as client:
            while not stop.is_set():
                try:
                    campaign.post(client)
                except httpx.HTTPError:
                    return  # the server is gone; this request never got a 202
                except BaseException as exc:  # a failed assertion in post()
                    errors.append(exc)
                    return
                accepted.release()

    thread = threading.Thread(target=post_loop)
    thread.start()
    try:
        for _ in range(goal):
            assert accepted.acquire(timeout=60), errors
        campaign.server.kill()
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    campaign.after_kill()


def wait_all_finished(data_dir: Path, timeout: float = 120) -> None:
    def finished() -> bool:
        conn = open_db(data_dir)
        try:
            return (
                conn.execute(
                    "SELECT count(*) FROM tasks WHERE status NOT IN"
                    " ('completed', 'failed', 'cancelled')"
                ).fetchone()[0]
                == 0
            )
        finally:
            conn.close()

    wait_for(finished, "every task to finish", timeout)


def deltas(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def reference_text(client: TestClient, body: dict[str, Any]) -> str:
    """The same request run uninterrupted, in a fresh in-process service."""
    answer = client.post("/v1/responses", json=dict(body, background=False))
    assert answer.status_code == 200, answer.text
    obj = answer.json()
    assert obj["status"] == "completed"
    return str(obj["output"][0]["content"][0]["text"])


@pytest.fixture
def crash_server(tmp_path: Path) -> Iterator[Server]:
    server = Server(
        tmp_path / "crash",
        env={"LMSP_TEST_ENGINE_DELAY": "0.02", "LMSP_PARALLEL": "2", "LMSP_GC_INTERVAL": "1h"},
    )
    try:
        yield server
    finally:
        server.kill()


def test_kill_9_at_random_moments(crash_server: Server, client: TestClient) -> None:
    seed = int(os.environ.get("LMSP_CRASH_SEED", random.randrange(2**32)))
    print(f"LMSP_CRASH_SEED={seed}")  # shown on failure, to replay the same kills
    campaign = Campaign(crash_server, random.Random(seed))

    def round_with(kill: Callable[[httpx.Client], None]) -> Callable[[], None]:
        def run() -> None:
            with crash_server.client() as http:
                kill(http)

        return run

    rounds = [
        round_with(lambda http: kill_mid_generation(campaign, http, "resume")),
        round_with(lambda http: kill_right_after_202(campaign, http)),
        round_with(lambda http: kill_mid_generation(campaign, http, "retry")),
        lambda: kill_during_posts(campaign),
        round_with(lambda http: kill_mid_generation(campaign, http, "fail")),
    ]
    for run in rounds:
        crash_server.start()
        campaign.check_recovery()
        run()
        assert campaign.last_kill, "every kill leaves unfinished work behind"

    crash_server.start()
    campaign.check_recovery()
    wait_all_finished(crash_server.data_dir)
    crash_server.stop()

    # every kill left work behind, and the kills covered the cells the table cares about
    assert campaign.recovered.get("failed", 0) >= 1
    assert campaign.recovered.get("resumed", 0) >= 1
    assert campaign.recovered.get("requeued_reset", 0) >= 1
    assert campaign.recovered.get("kept_queued", 0) >= 1

    conn = open_db(crash_server.data_dir)
    try:
        check_log_invariants(conn)  # gap-free from 0, one terminal event, integrity ok
        tasks = {r["id"]: r for r in conn.execute("SELECT * FROM tasks")}
        texts = {
            r["id"]: message_text(json.loads(r["output"] or "[]"))
            for r in conn.execute("SELECT * FROM responses")
        }
        logs = {task_id: task_log(conn, task_id) for task_id in tasks}
    finally:
        conn.close()

    left_by_task: dict[str, list[Leftover]] = {}
    for lo in campaign.leftovers:
        left_by_task.setdefault(lo.task_id, []).append(lo)
    assert len(campaign.sent) >= 25
    for task_id, sent in campaign.sent.items():
        task = tasks[task_id]
        log = logs[task_id]
        last = log[-1]
        # the status is what the last event says
        assert last["response"]["task"]["status"] == task["status"]
        assert last["response"]["status"] in (RESPONSE_STATUS[task["status"]], "incomplete")
        crashes = left_by_task.get(task_id, [])
        if sent.cancel_answer in ("cancelled", "cancelling") or any(
            lo.status == "cancelling" for lo in crashes
        ):
            assert task["status"] == "cancelled", (task_id, sent.cancel_answer)
            continue
        if sent.cancel_answer is not None:
            # the cancel came after the end: it changed nothing
            assert task["status"] == sent.cancel_answer
        if sent.body["on_restart"] == "fail" and crashes:
            assert task["status"] == "failed"
            assert task["error_code"] == "server_restarted"
            continue
        assert task["status"] == "completed", (task_id, task["status"], task["error_code"])
        expected = reference_text(client, sent.body)
        assert texts[sent.response_id] == expected
        if sent.body["on_restart"] == "resume":
            # resumes join: nothing lost, nothing repeated, across every restart
            assert deltas(log) == expected
        else:
            resets = [i for i, e in enumerate(log) if e.get("reset")]
            assert deltas(log[resets[-1] if resets else 0 :]) == expected
        # one more attempt for each requeue (loading, or running without resume)
        requeues = [lo for lo in crashes if recovery_kind(lo).startswith("requeued")]
        assert task["attempt"] == 1 + len(requeues)


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of an SSE answer, each its ``data`` plus ``_id`` and ``_event``."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if fields.get("data") == "[DONE]":  # the end of a responses stream
                return
            if "data" in fields:
                event = json.loads(fields["data"])
                yield dict(event, _id=int(fields["id"]), _event=fields["event"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def test_stream_continues_across_a_restart(tmp_path: Path, client: TestClient) -> None:
    """A stream read up to N, a ``kill -9``, then ``starting_after=N`` on the new process:
    the events go on at exactly N+1, and the text joins with nothing lost or repeated."""
    server = Server(tmp_path / "stream", env={"LMSP_TEST_ENGINE_DELAY": "0.05"})
    body = {
        "model": "lmsp-test",
        "input": "a stream across a crash",
        "background": True,
        "seed": 4242,
        "on_restart": "resume",
    }
    try:
        server.start()
        with server.client() as http:
            created = http.post("/v1/responses", json=body)
            assert created.status_code == 202
            response_id = created.json()["id"]
            seen: list[dict[str, Any]] = []
            # the whole log (LMSP lifecycle events too), so its numbers have no gaps
            whole = {"stream": "true", "include": "lmsp.lifecycle"}
            with http.stream("GET", f"/v1/responses/{response_id}", params=whole) as stream:
                for event in sse_events(stream):
                    seen.append(event)
                    if len([e for e in seen if "delta" in e]) >= 3:
                        break
        server.kill()
        last_seen = seen[-1]["_id"]
        server.start()
        with server.client() as http:
            url = f"/v1/responses/{response_id}"
            params = {**whole, "starting_after": str(last_seen)}
            with http.stream("GET", url, params=params) as stream:
                rest = list(sse_events(stream))
            # Last-Event-ID, as an EventSource reconnecting sends it, resumes the same way
            last_id = {"Last-Event-ID": str(last_seen)}
            with http.stream("GET", url, params=whole, headers=last_id) as stream:
                again = list(sse_events(stream))
            final = http.get(url).json()
        server.stop()
    finally:
        server.kill()

    assert [e["_id"] for e in seen] == list(range(last_seen + 1))
    assert [e["_id"] for e in rest] == list(range(last_seen + 1, last_seen + 1 + len(rest)))
    assert all(e["_id"] == e["sequence_number"] and e["_event"] == e["type"] for e in seen + rest)
    assert again == rest
    # the task really was interrupted mid-text and resumed from its snapshot
    assert [e["type"] for e in seen].count("response.output_text.delta") >= 3
    resumed = [e for e in rest if e["type"] == "response.in_progress"]
    assert len(resumed) == 1 and resumed[0]["resumed"] is True
    assert rest[-1]["type"] == "response.completed"
    text = deltas(seen) + deltas(rest)
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == text
    assert text == reference_text(client, body)
    assert len(text.split()) == TOKENS
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
        assert task_log(conn, final["task"]["id"]) == [
            {k: v for k, v in e.items() if not k.startswith("_")} for e in seen + rest
        ]
    finally:
        conn.close()
