"""Fair share (PROTOCOL.md 13) through a real ``lmsp serve`` and the real model: limits
answered ``429`` writing nothing, a light client's request not starved by a flood, the
service tiers, the usage ledger across ``kill -9``, and the audit log's hash chain
checked by ``lmsp doctor``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from lmsp.cli import main
from tests.helpers import Server, free_port, open_db, seeded_data_dir

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"


def ask(tokens: int, **fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": "Count from one to one hundred in words.",
        "max_output_tokens": tokens,
        "temperature": 0,
        **fields,
    }


def new_client(srv: Server, name: str, scopes: list[str]) -> tuple[str, httpx.Client]:
    with srv.client() as owner:
        made = owner.post("/v1/clients", json={"name": name, "scopes": scopes})
    assert made.status_code == 201, made.text
    http = httpx.Client(
        base_url=srv.url, headers={"Authorization": f"Bearer {made.json()['token']}"}, timeout=120
    )
    return made.json()["id"], http


def queue(http: httpx.Client, tokens: int, **fields: Any) -> str:
    made = http.post("/v1/responses", json=ask(tokens, background=True, **fields))
    assert made.status_code == 202, made.text
    return str(made.json()["task"]["id"])


def start_reads(data_dir: Path, ids: list[str], timeout: float = 600) -> dict[str, int]:
    """For each task, the read of the database (every 10 ms) that first saw it out of the
    queue, once all have finished. Tasks first seen in the same read left the queue in
    an order these reads cannot tell."""
    seen: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    marks = ",".join("?" * len(ids))
    read = 0
    while time.monotonic() < deadline:
        conn = open_db(data_dir)
        try:
            rows = conn.execute(f"SELECT id, status FROM tasks WHERE id IN ({marks})", ids)
            status = {r["id"]: r["status"] for r in rows}
        finally:
            conn.close()
        read += 1
        for i in ids:
            if status[i] != "queued":
                seen.setdefault(i, read)
        if all(s in ("completed", "failed", "cancelled") for s in status.values()):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"the tasks did not finish: {seen}")


def started_order(data_dir: Path, ids: list[str], timeout: float = 600) -> list[str]:
    """The order in which the tasks left the queue (with one sequence a task runs for
    far longer than a read's 10 ms), once all have finished."""
    seen = start_reads(data_dir, ids, timeout)
    return sorted(ids, key=lambda i: (seen[i], ids.index(i)))


def started(data_dir: Path, ids: list[str]) -> int:
    conn = open_db(data_dir)
    try:
        marks = ",".join("?" * len(ids))
        row = conn.execute(
            f"SELECT count(*) FROM tasks WHERE id IN ({marks}) AND status != 'queued'", ids
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


@pytest.fixture
def one_sequence(tmp_path: Path, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_PARALLEL": "1"}).start()
    yield srv
    srv.stop()


def test_a_flood_does_not_starve_another_client_and_tiers_order_the_queue(
    one_sequence: Server,
) -> None:
    srv = one_sequence
    _, heavy = new_client(srv, "heavy", ["responses:read", "responses:write"])
    _, light = new_client(srv, "light", ["responses:read", "responses:write"])
    flood = [queue(heavy, 24) for _ in range(6)]
    single = queue(light, 24)
    order = started_order(srv.data_dir, [*flood, single])
    assert single in order[:3], order  # B's finishes among the first three
    assert [t for t in order if t != single] == flood  # FIFO within a client

    # tiers: priority (with the scope) jumps the queue, flex waits behind default
    _, urgent = new_client(srv, "urgent", ["responses:write", "priority"])
    _, plain = new_client(srv, "plain", ["responses:write"])
    _, patient = new_client(srv, "patient", ["responses:write"])
    first = [queue(heavy, 24) for _ in range(3)]
    flexible = queue(patient, 24, service_tier="flex")
    later = [queue(heavy, 24) for _ in range(2)]
    refused = plain.post("/v1/responses", json=ask(8, background=True, service_tier="priority"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "insufficient_scope"
    jumped = urgent.post("/v1/responses", json=ask(24, background=True, service_tier="priority"))
    assert jumped.status_code == 202 and jumped.json()["service_tier"] == "priority"
    fast = jumped.json()["task"]["id"]
    order = started_order(srv.data_dir, [*first, flexible, *later, fast])
    heavy_waiting = [t for t in [*first, *later] if order.index(t) > 0]
    # at most the one task of heavy's already running starts before the priority one
    assert all(order.index(fast) < order.index(t) for t in heavy_waiting[1:]), order
    assert order[-1] == flexible, order  # every default task first, though queued later
    with srv.client() as owner:
        done = owner.get(f"/v1/tasks/{flexible}").json()
        answer = owner.get(f"/v1/responses/{done['response_id']}").json()
    assert answer["service_tier"] == "flex" and answer["status"] == "completed"


#: a request the bundled model answers at length (greedy: all of 128 tokens), so that a
#: heavy task holds its sequence for seconds ("Count from one …" ends after 8 tokens)
STORY = "Write a long story about a lighthouse keeper and the sea."


def flooded(srv: Server) -> tuple[httpx.Client, list[str]]:
    """A heavy client's six long tasks, two of them holding both sequences; and a light
    client with nothing queued."""
    _, heavy = new_client(srv, "heavy", ["responses:read", "responses:write"])
    _, light = new_client(srv, "light", ["responses:read", "responses:write"])
    flood = [queue(heavy, 128, input=STORY) for _ in range(6)]
    while started(srv.data_dir, flood) < 2:
        time.sleep(0.01)
    return light, flood


def test_with_two_sequences_a_light_client_starts_at_once(tmp_path: Path, blob_cache: Path) -> None:
    """The reserved sequence (``LMSP_RESERVED_SEQUENCES``, 1 by default): a client with
    nothing running starts while the heavy client's tasks hold both sequences."""
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_PARALLEL": "2"}).start()
    try:
        light, flood = flooded(srv)
        single = queue(light, 24)
        while status_of(srv.data_dir, single) == "queued":
            time.sleep(0.005)
        # it left the queue while heavy's first two still ran, and no third of heavy's
        assert all(status_of(srv.data_dir, t) in ("loading", "running") for t in flood[:2])
        assert started(srv.data_dir, flood) == 2
        # another newcomer: the reserve is one sequence; it starts with the first that
        # is free, never after a task of heavy's still queued then
        _, other = new_client(srv, "other", ["responses:read", "responses:write"])
        second = queue(other, 24)
        waiting = [t for t in flood if status_of(srv.data_dir, t) == "queued"]
        seen = start_reads(srv.data_dir, [*flood, single, second])
        assert all(seen[second] <= seen[t] for t in waiting), (waiting, seen)
    finally:
        srv.stop()


def test_without_the_reserve_a_light_client_is_next(tmp_path: Path, blob_cache: Path) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    env = {"LMSP_PARALLEL": "2", "LMSP_RESERVED_SEQUENCES": "0"}
    srv = Server(data_dir, env=env).start()
    try:
        light, flood = flooded(srv)
        single = queue(light, 24)
        waiting = [t for t in flood if status_of(srv.data_dir, t) == "queued"]
        seen = start_reads(srv.data_dir, [*flood, single])
        assert seen[single] > min(seen[t] for t in flood)  # it waited for a sequence
        # it starts with the first sequence that frees up, before more of heavy's
        assert all(seen[single] <= seen[t] for t in waiting), (waiting, seen)
    finally:
        srv.stop()


def status_of(data_dir: Path, task_id: str) -> str:
    conn = open_db(data_dir)
    try:
        return str(conn.execute("SELECT status FROM tasks WHERE id = ?", (task_id,)).fetchone()[0])
    finally:
        conn.close()


def doctor(data_dir: Path) -> tuple[int, dict[str, Any]]:
    env = {"LMSP_DATA_DIR": str(data_dir), "LMSP_URL": f"http://127.0.0.1:{free_port()}"}
    result = CliRunner().invoke(main, ["doctor", "--json"], env=env)
    report = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in report["checks"]}


def test_limits_usage_and_audit(tmp_path: Path, blob_cache: Path) -> None:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    # every new client may hold 2 unfinished tasks (the owner is never limited)
    srv = Server(data_dir, env={"LMSP_PARALLEL": "1", "LMSP_DEFAULT_LIMITS": "max_queued=2"})
    srv.start()
    try:
        owner = srv.client(timeout=120)
        owner_id = next(c["id"] for c in owner.get("/v1/clients").json()["data"])
        busy = queue(owner, 256)  # the one sequence is taken: what follows stays queued
        limited_id, limited = new_client(srv, "limited", ["responses:read", "responses:write"])
        first, second = queue(limited, 8), queue(limited, 8)
        over = limited.post("/v1/responses", json=ask(8, background=True))
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "rate_limit_exceeded"
        assert over.json()["error"]["type"] == "rate_limit_error"
        assert int(over.headers["Retry-After"]) >= 1
        keyed = limited.post(
            "/v1/responses", json=ask(8, background=True), headers={"Idempotency-Key": "k-429"}
        )
        assert keyed.status_code == 429
        listed = limited.get("/v1/tasks").json()["data"]
        assert {t["id"] for t in listed} == {first, second}
        conn = open_db(data_dir)
        try:
            keys = conn.execute(
                "SELECT count(*) FROM idempotency_keys WHERE key = 'k-429'"
            ).fetchone()[0]
            mine = conn.execute(
                "SELECT count(*) FROM tasks WHERE client_id = ?", (limited_id,)
            ).fetchone()[0]
        finally:
            conn.close()
        assert keys == 0 and mine == 2
        # the owner is not limited, and cannot be
        extra = [queue(owner, 8) for _ in range(3)]
        assert len(extra) == 3
        refused = owner.patch(f"/v1/clients/{owner_id}", json={"limits": {"max_queued": 1}})
        assert refused.status_code == 409
        # the owner lifts the limit: the client is no longer refused
        lifted = owner.patch(f"/v1/clients/{limited_id}", json={"limits": {"max_queued": None}})
        assert lifted.status_code == 200 and lifted.json()["limits"]["max_queued"] is None
        queue(limited, 8)
        for task_id in [busy, *extra]:
            owner.post(f"/v1/tasks/{task_id}/cancel")

        # usage: three requests of one client, summed; another client sees only its own
        user_id, user = new_client(srv, "user", ["responses:read", "responses:write"])
        used = []
        for tokens in (8, 12, 16):
            done = user.post("/v1/responses", json=ask(tokens))
            assert done.status_code == 200 and done.json()["status"] in ("completed", "incomplete")
            used.append(done.json()["usage"])
        expected = {
            "requests": 3,
            "input_tokens": sum(u["input_tokens"] for u in used),
            "cached_tokens": sum(u["input_tokens_details"]["cached_tokens"] for u in used),
            "output_tokens": sum(u["output_tokens"] for u in used),
        }

        def usage_of(http: httpx.Client) -> list[dict[str, Any]]:
            got = http.get("/v1/usage", params={"group_by": "model"})
            assert got.status_code == 200, got.text
            return list(got.json()["data"])

        def figures(rows: list[dict[str, Any]]) -> dict[str, int]:
            return {k: rows[0][k] for k in expected}

        rows = usage_of(user)
        assert [(r["client_id"], r["model"]) for r in rows] == [(user_id, MODEL)]
        assert figures(rows) == expected
        assert {r["client_id"] for r in usage_of(limited)} <= {limited_id}
        assert user.get("/v1/usage", params={"client_id": limited_id}).status_code == 404
        everyone = owner.get("/v1/usage", params={"client_id": user_id}).json()["data"]
        assert figures(everyone) == expected
        metrics = owner.get("/metrics").text
        assert f'lmsp_client_output_tokens_total{{client="user",client_id="{user_id}"}}' in metrics

        # kill -9: the ledger is in the database, and so is the day's token budget
        owner.close()
        srv.kill()
        srv.start()
        owner = srv.client(timeout=120)
        assert figures(usage_of(user)) == expected
        spent = expected["input_tokens"] + expected["output_tokens"]
        capped = owner.patch(f"/v1/clients/{user_id}", json={"limits": {"tokens_per_day": spent}})
        assert capped.status_code == 200
        broke = user.post("/v1/responses", json=ask(8))
        assert broke.status_code == 429 and 1 <= int(broke.headers["Retry-After"]) <= 86400
        assert figures(usage_of(user)) == expected  # the refusal wrote nothing

        # the audit log: creation, limit change, revocation
        assert owner.delete(f"/v1/clients/{limited_id}").status_code == 200
        entries = owner.get("/v1/audit", params={"target": limited_id}).json()["data"]
        actions = [e["action"] for e in entries]
        assert actions == ["client.created", "client.limits_changed", "client.revoked"]
        assert entries[0]["change"]["limits"]["max_queued"] == 2
        assert entries[1]["change"]["after"]["max_queued"] is None
        assert all(e["actor"] == owner_id for e in entries)
        assert user.get("/v1/audit").status_code == 403
        # the same through the command line
        env = {"LMSP_URL": srv.url, "LMSP_DATA_DIR": str(data_dir), "LMSP_TOKEN": None}
        cli = CliRunner()
        set_limit = cli.invoke(
            main, ["clients", "limit", "user", "--tokens-per-minute", "900", "--json"], env=env
        )
        assert set_limit.exit_code == 0, set_limit.output
        assert json.loads(set_limit.stdout)["limits"]["tokens_per_minute"] == 900
        shown = cli.invoke(main, ["clients", "usage", "user", "--by", "total", "--json"], env=env)
        assert shown.exit_code == 0, shown.output
        totals = json.loads(shown.stdout)
        assert [(t["client_id"], t["output_tokens"]) for t in totals] == [
            (user_id, expected["output_tokens"])
        ]
        logged = cli.invoke(main, ["audit", "--target", user_id, "--json"], env=env)
        assert logged.exit_code == 0, logged.output
        assert [e["action"] for e in json.loads(logged.stdout)][-2:] == [
            "client.limits_changed",
            "client.limits_changed",
        ]
        changed_row = entries[1]["id"]
        owner.close()
        user.close()
        limited.close()
        limited_rows = [e["id"] for e in entries]
    finally:
        srv.stop()

    code, checks = doctor(data_dir)
    assert checks["audit log"]["status"] == "ok", checks["audit log"]
    conn = open_db(data_dir)
    try:  # someone edits the log by hand (past its append-only trigger)
        conn.execute("DROP TRIGGER audit_log_no_update")
        conn.execute(
            'UPDATE audit_log SET change = \'{"after":{"max_queued":1000}}\' WHERE id = ?',
            (changed_row,),
        )
        conn.commit()
    finally:
        conn.close()
    code, checks = doctor(data_dir)
    assert code == 1
    assert checks["audit log"]["status"] == "fail"
    assert f"row {changed_row} " in checks["audit log"]["detail"], checks["audit log"]
    assert limited_rows[0] < changed_row < limited_rows[2]
