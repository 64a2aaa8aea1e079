"""Three real ``lmsp serve`` nodes on one PostgreSQL database (issue: beyond one machine).

Each node has its own data directory (blobs, prefix cache) and shares the database:
tasks, events, clients, idempotency keys. The tests kill, pause and cancel across nodes
and check the log rules of chapter 11 on the shared database afterwards.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, check_log_invariants, task_log
from tests.pgcluster import Cluster
from tests.pgcluster import store_reader as _reader
from tests.test_crash import sse_events

pytestmark = pytest.mark.slow

TTL = 3.0  # seconds: short, so the takeover tests wait little


class _Url:
    def __init__(self, url: str) -> None:
        self.database_url = url


def reader(url: str) -> Any:
    return _reader(_Url(url))


def node(tmp_path: Path, url: str, name: str, delay: str = "0.03") -> Server:
    data_dir = tmp_path / name
    data_dir.mkdir()
    env = {
        "LMSP_DATABASE_URL": url,
        "LMSP_NODE_ID": name,
        "LMSP_LEASE_TTL": f"{TTL}s",
        "LMSP_TEST_ENGINE_DELAY": delay,
        "LMSP_PARALLEL": "4",
    }
    return Server(data_dir, env=env)


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, pg_cluster: Cluster
) -> Iterator[tuple[str, list[Server]]]:
    """Three nodes; the test engine's step delay (its answers are 24 words) is the
    fixture's parameter: 0.4 s unless a test asks for another."""
    delay = str(getattr(request, "param", "0.4"))
    url = pg_cluster.database()
    first = node(tmp_path, url, "a", delay).start()  # creates the database and owner token
    others = [node(tmp_path, url, name, delay) for name in ("b", "c")]
    for srv in others:
        srv.start()
    servers = [first, *others]
    try:
        yield url, servers
    finally:
        for srv in servers:
            if srv.proc is not None:
                os.kill(srv.proc.pid, signal.SIGCONT)
            srv.stop()


def owner_token(servers: list[Server]) -> str:
    return servers[0].token  # later nodes join: the owner token is the first node's


def client(srv: Server, token: str) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def create(http: httpx.Client, policy: str, tokens: int = 400, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "lmsp-test",
        "input": f"scale-out with on_restart={policy}",
        "background": True,
        "seed": 11,
        "max_output_tokens": tokens,
        "on_restart": policy,
        **extra,
    }
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 202, response.text
    return dict(response.json())


def task_row(url: str, task_id: str) -> Any:
    conn = reader(url)
    try:
        return conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    finally:
        conn.close()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def running_on(url: str, task_id: str, min_seq: int = 5) -> str | None:
    row = task_row(url, task_id)
    if row["status"] == "running" and row["last_sequence_number"] >= min_seq:
        return str(row["node_id"])
    return None


@pytest.mark.parametrize("cluster", ["1.0"], indirect=True)
def test_a_killed_node_s_tasks_end_per_policy_on_another(
    cluster: tuple[str, list[Server]],
) -> None:
    url, servers = cluster
    a, b, c = servers
    token = owner_token(servers)
    b.stop()  # A alone claims: it generates all three tasks
    c.stop()
    with client(a, token) as http:
        made = {p: create(http, p, tokens=1500) for p in ("fail", "retry", "resume")}
    ids = {policy: task_id_of(url, m["id"]) for policy, m in made.items()}
    wait_for(lambda: all(running_on(url, t) == "a" for t in ids.values()), 60, "three on A")
    b.start()
    c.start()
    with client(b, token) as http:  # every node shows every node and the tasks it holds
        shown = {n["id"]: n for n in http.get("/v1/service/activity").json()["nodes"]}
    assert {t["id"] for t in shown["a"]["tasks"]} == set(ids.values())
    assert shown["a"]["unfinished"] == 3 and shown["b"]["tasks"] == []
    held = ids
    victim = "a"
    committed = {t: task_row(url, t)["last_sequence_number"] for t in held.values()}
    killed_at = time.monotonic()
    a.kill()

    def finished() -> bool:
        return all(
            task_row(url, t)["status"] in ("completed", "failed", "cancelled") for t in ids.values()
        )

    wait_for(finished, 180, "the tasks to finish on the other nodes")
    took = time.monotonic() - killed_at
    conn = reader(url)
    try:
        check_log_invariants(conn)
        for policy, task_id in held.items():
            row = conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
            log = task_log(conn, task_id)
            if policy == "fail":
                assert row["status"] == "failed" and row["error_code"] == "node_lost"
            else:
                assert row["status"] == "completed", (policy, row["status"])
                assert row["node_id"] != victim
            if policy == "resume":
                before = log[: committed[task_id] + 1]
                after = log[committed[task_id] + 1 :]
                assert any(e.get("resumed") for e in after)  # continued, not restarted
                text = "".join(e.get("delta", "") for e in log if e["type"].endswith(".delta"))
                kept = "".join(e.get("delta", "") for e in before if e["type"].endswith(".delta"))
                assert text.startswith(kept) and len(text) > len(kept)
    finally:
        conn.close()
    print(f"tasks of a killed node finished elsewhere {took:.1f}s after the kill (TTL {TTL}s)")


def task_id_of(url: str, response_id: str) -> str:
    conn = reader(url)
    try:
        row = conn.execute("SELECT id FROM tasks WHERE response_id = ?", (response_id,))
        return str(row.fetchone()[0])
    finally:
        conn.close()


def test_a_paused_node_writes_nothing_after_its_lease(cluster: tuple[str, list[Server]]) -> None:
    url, servers = cluster
    token = owner_token(servers)
    with client(servers[1], token) as http:
        made = create(http, "resume", tokens=600)
    task_id = task_id_of(url, made["id"])
    wait_for(lambda: running_on(url, task_id) is not None, 60, "the task running")
    paused_name = running_on(url, task_id)
    paused = next(s for s in servers if s.data_dir.name == paused_name)
    assert paused.proc is not None
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        # another node takes the task over once the lease ran out
        wait_for(
            lambda: task_row(url, task_id)["node_id"] not in (None, paused_name),
            TTL + 30,
            "another node to take the task over",
        )
        taken_at = task_row(url, task_id)["last_sequence_number"]
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    wait_for(lambda: task_row(url, task_id)["status"] in ("completed", "failed"), 60, "the end")
    time.sleep(1.0)  # the paused node had its chance to write
    conn = reader(url)
    try:
        check_log_invariants(conn)  # gap-free: no second writer interleaved numbers
        assert task_row(url, task_id)["status"] == "completed"
        log = task_log(conn, task_id)
        resumed = [e for e in log if e.get("resumed")]
        assert len(resumed) == 1 and resumed[0]["sequence_number"] <= taken_at + 1
    finally:
        conn.close()


def test_cancel_idempotency_and_revocation_across_nodes(
    cluster: tuple[str, list[Server]],
) -> None:
    url, servers = cluster
    a, b, c = servers
    token = owner_token(servers)
    # cancel on C of a task generating elsewhere
    with client(a, token) as http_a, client(c, token) as http_c, client(b, token) as http_b:
        made = create(http_a, "fail", tokens=2000)
        task_id = task_id_of(url, made["id"])
        wait_for(lambda: running_on(url, task_id) is not None, 60, "the task running")
        began = time.monotonic()
        answer = http_c.post(f"/v1/responses/{made['id']}/cancel")
        assert answer.status_code == 200, answer.text
        wait_for(lambda: task_row(url, task_id)["status"] == "cancelled", 10, "cancelled")
        print(f"cancel on another node finished in {time.monotonic() - began:.2f}s")
        # an Idempotency-Key replayed on another node returns the first response
        body = {"model": "lmsp-test", "input": "once", "background": True, "seed": 3}
        first = http_a.post("/v1/responses", json=body, headers={"Idempotency-Key": "k-1"})
        again = http_b.post("/v1/responses", json=body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 202
        assert first.json()["id"] == again.json()["id"]
        # a client made on A, revoked on B, is refused on every node within a second
        made_client = http_a.post("/v1/clients", json={"name": "agent", "scopes": ["models:read"]})
        assert made_client.status_code == 201, made_client.text
        agent = made_client.json()
        for srv in servers:
            with client(srv, agent["token"]) as http:
                assert http.get("/v1/models").status_code == 200
        assert http_b.delete(f"/v1/clients/{agent['id']}").status_code in (200, 204)
        revoked_at = time.monotonic()
        for srv in servers:
            with client(srv, agent["token"]) as http:
                wait_for(lambda http=http: http.get("/v1/models").status_code == 401, 1.0, "401")
        print(f"revocation seen on all nodes within {time.monotonic() - revoked_at:.2f}s")


def test_a_stream_on_b_follows_a_task_on_a_and_resumes_on_c(
    cluster: tuple[str, list[Server]],
) -> None:
    """A: the node generating; B: another node, serving the stream until it is killed;
    C: the third, where the client resumes with ``Last-Event-ID``."""
    url, servers = cluster
    token = owner_token(servers)
    whole = {"stream": "true", "include": "lmsp.lifecycle"}
    with client(servers[0], token) as http:
        made = create(http, "fail", tokens=300)
    task_id = task_id_of(url, made["id"])
    wait_for(lambda: running_on(url, task_id, 0) is not None, 60, "the task running")
    a_name = running_on(url, task_id, 0)
    b, c = [srv for srv in servers if srv.data_dir.name != a_name]
    path = f"/v1/responses/{made['id']}"
    seen: list[dict[str, Any]] = []
    with client(b, token) as http_b, http_b.stream("GET", path, params=whole) as stream:
        for event in sse_events(stream):
            seen.append(event)
            if len([e for e in seen if "delta" in e]) >= 5:
                break
    b.kill()  # the node serving the stream goes; the task generates on on A
    last = seen[-1]["_id"]
    with client(c, token) as http_c:
        with http_c.stream("GET", path, params=whole, headers={"Last-Event-ID": str(last)}) as s:
            rest = list(sse_events(s))
        final = http_c.get(path).json()
    ids = [e["_id"] for e in seen + rest]
    assert ids == list(range(len(ids)))  # one gap-free log, whichever node served it
    assert rest[-1]["type"] == "response.completed" and final["status"] == "completed"
    text = "".join(e.get("delta", "") for e in seen + rest if e["type"].endswith("text.delta"))
    assert final["output"][0]["content"][0]["text"] == text
    assert task_row(url, task_id)["node_id"] == a_name  # generated on A throughout


@pytest.mark.parametrize("cluster", ["0.01"], indirect=True)
def test_cancel_versus_complete_across_nodes(cluster: tuple[str, list[Server]]) -> None:
    """200 short tasks made on one node and cancelled on another at random moments:
    every one ends either completed (no cancel logged) or cancelled, never both."""
    import random
    import threading

    url, servers = cluster
    token = owner_token(servers)
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        local = random.Random(seed)
        with (
            client(servers[seed % 3], token) as maker,
            client(servers[(seed + 1) % 3], token) as canceller,
        ):
            for _ in range(50):
                made = create(maker, "fail", tokens=local.randint(1, 24))
                time.sleep(local.random() * 0.3)
                answer = canceller.post(f"/v1/responses/{made['id']}/cancel")
                assert answer.status_code == 200, answer.text
                with lock:
                    outcomes[made["id"]] = answer.status_code

    threads = [
        threading.Thread(target=worker, args=(rng.randint(0, 99) * 3 + i,)) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 200
    conn = reader(url)
    ends = {"completed": 0, "cancelled": 0}
    try:

        def settled() -> bool:
            rows = conn.execute("SELECT status FROM tasks").fetchall()
            return all(r[0] in ("completed", "cancelled", "failed") for r in rows)

        wait_for(settled, 60, "every task to settle")
        check_log_invariants(conn)  # one terminal event per task, matching its status
        for response_id in outcomes:
            row = conn.execute(
                "SELECT id, status FROM tasks WHERE response_id = ?", (response_id,)
            ).fetchone()
            kinds = [e["type"] for e in task_log(conn, row["id"])]
            ends[row["status"]] += 1
            if row["status"] == "completed":
                assert "response.cancelled" not in kinds
            else:
                assert row["status"] == "cancelled" and "response.completed" not in kinds
    finally:
        conn.close()
    print(f"cancel-versus-complete across nodes: {ends}, 0 violations")


def test_the_real_model_answers_through_a_postgres_node(tmp_path: Path, pg_url: str) -> None:
    """The bundled model (llama.cpp) on a node whose state is in PostgreSQL."""
    srv = node(tmp_path, pg_url, "real").start()
    try:
        with httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"}, timeout=600
        ) as http:
            answer = http.post(
                "/v1/responses",
                json={
                    "model": "smollm2-135m-instruct",
                    "input": "Say hello.",
                    "max_output_tokens": 16,
                    "temperature": 0,
                },
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["status"] in ("completed", "incomplete")
            text = body["output"][0]["content"][0]["text"]
            assert text.strip()
            again = http.get(f"/v1/responses/{body['id']}").json()
            assert again["output"][0]["content"][0]["text"] == text
    finally:
        srv.stop()
    row = task_row(pg_url, task_id_of(pg_url, body["id"]))
    assert row["status"] in ("completed",) and row["node_id"] == "real"
