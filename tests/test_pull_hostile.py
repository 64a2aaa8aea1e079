"""Pulls from a hostile hub, through the real server (tests/hub_standin.py on loopback).

A hub that sends fewer bytes than it lists — the whole file then ``416`` for the rest,
no byte at all, half of what is asked each time, a cut then ``416`` — fails the pull
after :data:`~lmsp.outbound.pull.MAX_FAILURES` requests of the file, each after a back-off,
with a ``hub_error`` naming what the hub did (it used to be asked again at once, forever,
``HF_TOKEN`` with every request). A hub that trickles a byte a second cannot hold a
cancel or the shutdown: the connection is shut down under the read.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lmsp.outbound.pull import MAX_FAILURES
from tests.campaigns.invariants import report
from tests.helpers import Server, check_log_invariants, open_db, seeded_data_dir
from tests.hub_standin import Hub, HubFile, serve
from tests.test_pull import REF, REPO, finished, leftovers, make_hub, start, variant, wait_for

__all__ = ["variant"]  # the module's fixture, used here

#: the hostile answers, each a file of its own (its quantization tag picks it)
SHORT = {
    "Q2_K": "longer",  # listed 1 MiB larger than it is: the whole file, then 416
    "Q3_K_S": "empty",  # headers and no byte, each time
    "Q5_0": "half",  # half of what is asked each time, a clean end
    "Q6_K": "416",  # the first GET cut half-way, then 416 for every Range
}


def hostile_hub(variant: tuple[Path, str]) -> Hub:
    path, sha = variant
    size = path.stat().st_size
    files = [
        HubFile(
            f"Smol.{tag}.gguf",
            path,
            size + (1 << 20) if mode == "longer" else size,
            sha,
            None if mode == "longer" else mode,
        )
        for tag, mode in SHORT.items()
    ]
    return serve(Hub(REPO, files))


@pytest.fixture
def trickling(variant: tuple[Path, str]) -> Iterator[Hub]:
    hub = make_hub(variant, trickle=1.0)  # 64 KiB, then a byte a second
    yield hub
    hub.close()


@pytest.mark.slow
def test_a_hub_sending_fewer_bytes_than_it_lists_fails_the_pull_after_a_few_requests(
    tmp_path: Path, blob_cache: Path, variant: tuple[Path, str]
) -> None:
    hub = hostile_hub(variant)
    secret = "hf_" + "shr" * 10
    server = start(tmp_path, blob_cache, hub, HF_TOKEN=secret)
    try:
        with server.client() as http:
            tasks = {}
            for tag in SHORT:
                answer = http.post("/v1/models/pull", json={"from": f"hf.co/{REPO}:{tag}"})
                assert answer.status_code == 202, answer.text
                tasks[tag] = answer.json()["task"]["id"]
            ended = {
                tag: wait_for(functools.partial(finished, http, task_id), f"the pull of {tag}", 180)
                for tag, task_id in tasks.items()
            }
        for tag, task in ended.items():
            name = f"Smol.{tag}.gguf"
            assert task["status"] == "failed", (tag, task)
            error = task["error"]
            assert error["code"] == "hub_error", (tag, error)
            assert (
                name in error["message"] and f"{MAX_FAILURES} failed attempts" in error["message"]
            )
            assert hub.gets(name) == MAX_FAILURES, (tag, hub.gets(name))
        size = variant[0].stat().st_size
        assert "416 (Range Not Satisfiable)" in ended["Q2_K"]["error"]["message"]
        assert f"lists {size + (1 << 20):,} bytes" in ended["Q2_K"]["error"]["message"]
        assert "sent no byte from byte 0" in ended["Q3_K_S"]["error"]["message"]
        assert "its answer ended at byte" in ended["Q5_0"]["error"]["message"]
        assert "416 (Range Not Satisfiable)" in ended["Q6_K"]["error"]["message"]
        # every request was an attempt after a back-off, not a loop
        for name in (f"Smol.{tag}.gguf" for tag in SHORT):
            times = [r["at"] for r in hub.requests if r["path"] == name]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert all(gap > 0.3 for gap in gaps), (name, gaps)
        assert set(hub.authorizations) == {f"Bearer {secret}"}
        assert secret not in server.log_path.read_text()
        assert leftovers(server.data_dir) == []
    finally:
        server.stop()
        hub.close()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
    finally:
        conn.close()


def pulling(server: Server, hub: Hub) -> str:
    """A pull of :data:`REF` reading from ``hub`` (its first 64 KiB arrived)."""
    with server.client() as http:
        task_id: str = http.post("/v1/models/pull", json={"from": REF}).json()["task"]["id"]
        wait_for(lambda: http.get(f"/v1/tasks/{task_id}").json()["status"] == "running", "running")
    wait_for(lambda: hub.gets() >= 1, "the pull's request")
    time.sleep(0.5)  # the first 64 KiB are read, the next read waits on the trickle
    return task_id


@pytest.mark.slow
def test_a_cancel_and_the_shutdown_end_a_pull_from_a_trickling_hub_at_once(
    tmp_path: Path, blob_cache: Path, trickling: Hub
) -> None:
    server = start(tmp_path, blob_cache, trickling)
    try:
        task_id = pulling(server, trickling)
        with server.client() as http:
            asked = time.monotonic()
            cancel = http.post(f"/v1/tasks/{task_id}/cancel")
            assert cancel.status_code == 200, cancel.text
            task = wait_for(lambda: finished(http, task_id), "the cancel", 60)
            took = time.monotonic() - asked
            assert task["status"] == "cancelled", task
            wait_for(lambda: leftovers(server.data_dir) == [], "the partial file to go", 30)
        report(f"pull from a trickling hub: cancelled in {took:.2f} s")

        task_id = pulling(server, trickling)
        assert server.proc is not None
        began = time.monotonic()
        server.stop()  # SIGTERM
        took = time.monotonic() - began
        # the pull itself stopped (it did not hold a read past the shutdown)
        stopped = f"pull {task_id}: stopped for the shutdown"
        assert stopped in server.log_path.read_text()
        report(f"pull from a trickling hub: SIGTERM to exit in {took:.2f} s")

        server.start()  # it resumes after the restart; cancelled again, it ends at once
        with server.client() as http:
            wait_for(lambda: http.get(f"/v1/tasks/{task_id}").json()["status"] == "running", "run")
            http.post(f"/v1/tasks/{task_id}/cancel")
            task = wait_for(lambda: finished(http, task_id), "the cancel after the restart", 60)
            assert task["status"] == "cancelled", task
    finally:
        server.stop()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
    finally:
        conn.close()


def test_the_hostile_stand_in_answers_as_described(variant: tuple[Path, str]) -> None:
    """The stand-in's own modes (so the tests above test lmsp, not a stand-in's bug)."""
    hub = hostile_hub(variant)
    try:
        url = f"{hub.url}/{REPO}/resolve/x/"
        size = variant[0].stat().st_size
        empty = httpx.get(url + "Smol.Q3_K_S.gguf", headers={"Range": "bytes=10-"})
        assert empty.status_code == 206 and empty.content == b""
        half = httpx.get(url + "Smol.Q5_0.gguf", headers={"Range": "bytes=10-"})
        assert half.status_code == 206 and len(half.content) == (size - 10) // 2
        refused = httpx.get(url + "Smol.Q6_K.gguf", headers={"Range": "bytes=10-"})
        assert refused.status_code == 416
        whole = httpx.get(url + "Smol.Q2_K.gguf")
        assert whole.status_code == 200 and len(whole.content) == size
        past = httpx.get(url + "Smol.Q2_K.gguf", headers={"Range": f"bytes={size}-"})
        assert past.status_code == 416
    finally:
        hub.close()


@pytest.mark.slow
def test_a_cancel_on_another_node_ends_a_pull_from_a_trickling_hub(
    tmp_path: Path, blob_cache: Path, trickling: Hub, pg_url: str
) -> None:
    """On PostgreSQL: the pull runs on the node that accepted it; a cancel sent to
    another node reaches it (the database's notification) and ends it at once, where it
    waited for a progress write that a trickling hub never let come."""
    nodes = []
    for name in ("a", "b"):
        data_dir = seeded_data_dir(tmp_path / name, blob_cache)
        env = {"LMSP_DATABASE_URL": pg_url, "LMSP_NODE_ID": name, "LMSP_HF_ENDPOINT": trickling.url}
        nodes.append(Server(data_dir, env=env).start())
    a, b = nodes
    try:
        task_id = pulling(a, trickling)
        token = a.token  # the owner's (the first node created it)
        with httpx.Client(
            base_url=b.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http:
            assert http.post(f"/v1/tasks/{task_id}/cancel").status_code == 200
            task = wait_for(lambda: finished(http, task_id), "the cancel from node b", 60)
            assert task["status"] == "cancelled", task
        wait_for(lambda: leftovers(a.data_dir) == [], "node a's partial file to go", 30)
    finally:
        for srv in nodes:
            srv.stop()
