"""``POST /v1/models/pull`` and ``lmsp pull`` through the real server, against a stand-in
for the hub's file API on loopback (tests/hub_standin.py) serving the bundled model with
one metadata byte changed (so it is a new blob, not the bundled one).

Through the real server: a connection cut twice mid-file resumes with ``Range`` and the
pulled model answers; a ``kill -9`` halfway resumes after the restart from the bytes on
disk; a wrong SHA-256 fails with ``digest_mismatch`` leaving nothing; a cancel deletes
the partial; ``lmsp pull`` shows progress and exits 0, and refuses a missing repository,
a missing quantization and a non-hf.co reference with one ``Error:`` line each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.bootstrap import bundled_model_path
from lmsp.outbound.hub import parse_reference, pick_files
from tests.campaigns.smallfs import fill, require_small_fs, seed_by_symlink, small_fs
from tests.helpers import Server, check_log_invariants, open_db, seeded_data_dir, task_log
from tests.hub_standin import Hub, HubFile, serve, sha256_of, split_gguf, variant_gguf

REPO = "test-owner/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REF = f"hf.co/{REPO}:Q4_1"
MODEL = f"{REPO}:Q4_1"


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = variant_gguf(bundled_model_path(), tmp_path_factory.mktemp("hub") / FILE)
    return path, sha256_of(path)


def make_hub(variant: tuple[Path, str], **options: Any) -> Hub:
    path, sha = variant
    files = [
        HubFile(FILE, path, path.stat().st_size, options.pop("sha", sha)),
        HubFile("SmolLM2-135M-Instruct.Q8_0.gguf", None, 145_000_000, "ab" * 32),
    ]
    return serve(Hub(REPO, files, **options))


@pytest.fixture
def hub_factory(variant: tuple[Path, str]) -> Iterator[Callable[..., Hub]]:
    made: list[Hub] = []

    def make(**options: Any) -> Hub:
        made.append(make_hub(variant, **options))
        return made[-1]

    yield make
    for hub in made:
        hub.close()


def start(tmp_path: Path, blob_cache: Path, hub: Hub, **env: str) -> Server:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    return Server(data_dir, env={"LMSP_HF_ENDPOINT": hub.url, **env}).start()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def finished(http: httpx.Client, task_id: str) -> dict[str, Any] | None:
    task: dict[str, Any] = http.get(f"/v1/tasks/{task_id}").json()
    return task if task["status"] in ("completed", "failed", "cancelled") else None


def pulled(http: httpx.Client) -> dict[str, Any]:
    """Pull :data:`REF` and wait for the task's end."""
    task_id = http.post("/v1/models/pull", json={"from": REF}).json()["task"]["id"]
    task: dict[str, Any] = wait_for(lambda: finished(http, task_id), "the pull")
    return task


def progress_events(http: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    page = http.get(
        f"/v1/tasks/{task_id}/events",
        params={"limit": 1000},
        headers={"Accept": "application/json"},
    ).json()
    return [e for e in page["data"] if e["type"] == "model.pull.progress"]


def leftovers(data_dir: Path) -> list[Path]:
    work = data_dir / "pulls"
    return sorted(work.rglob("*")) if work.exists() else []


# -- the hub's file list, without a server ------------------------------------------------------


def test_a_reference_names_an_hf_repo_and_a_quantization() -> None:
    ref = parse_reference("hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:q4_k_m")
    assert (ref.repo, ref.quant) == ("bartowski/Qwen2.5-7B-Instruct-GGUF", "q4_k_m")
    assert parse_reference("huggingface.co/a/b").quant == "Q4_K_M"  # the usual default
    for bad in ("ollama.com/library/qwen", "hf.co/only-owner", "/etc/passwd", "hf.co/a/b:x y"):
        with pytest.raises(Exception) as caught:
            parse_reference(bad)
        assert getattr(caught.value, "code", None) == "invalid_reference"


def test_the_quantization_tag_picks_one_file_or_every_part_of_a_split_one() -> None:
    def entry(path: str) -> dict[str, Any]:
        return {"type": "file", "path": path, "size": 10, "lfs": {"oid": "c" * 64, "size": 10}}

    tree = [
        entry("m-Q4_K_M.gguf"),
        entry("m-Q4_K_S.gguf"),
        entry("big/m-Q8_0-00002-of-00002.gguf"),
        entry("big/m-Q8_0-00001-of-00002.gguf"),
        entry("mmproj-m-Q4_K_M.gguf"),
    ]
    assert [f.path for f in pick_files(tree, "q4_k_m")] == ["m-Q4_K_M.gguf"]
    parts = [f.path for f in pick_files(tree, "Q8_0")]
    assert parts == ["big/m-Q8_0-00001-of-00002.gguf", "big/m-Q8_0-00002-of-00002.gguf"]
    with pytest.raises(Exception) as caught:
        pick_files(tree, "Q4_K")  # a prefix of a tag is not the tag
    assert getattr(caught.value, "code", None) == "quant_not_found"
    assert "Q4_K_M" in str(caught.value) and "Q8_0" in str(caught.value)


# -- through the real server ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_cut_connection_resumes_with_range_and_the_pulled_model_answers(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    hub = hub_factory(cut_first=2)
    server = start(tmp_path, blob_cache, hub)
    try:
        with server.client(timeout=600) as http:  # the model loads for its first answer
            answer = http.post("/v1/models/pull", json={"from": REF})
            assert answer.status_code == 202, answer.text
            body = answer.json()
            assert body["model"] == MODEL and body["task"]["status"] in ("queued", "loading")
            task = wait_for(lambda: finished(http, body["task"]["id"]), "the pull")
            assert task["status"] == "completed", task
            size = variant[0].stat().st_size
            starts = hub.ranges()
            assert len(starts) == 3 and starts[0] == 0, starts
            assert 0 < starts[1] < starts[2] < size  # each resumed from the bytes it had
            model = http.get(f"/v1/models/{MODEL}").json()
            assert model["digest"] == f"sha256:{variant[1]}"
            assert model["size_bytes"] == size and model["status"] == "ready"
            assert model["metadata"]["quantization"] and model["metadata"]["chat_template"]
            assert model["metadata"]["source"] == f"hf.co/{REPO}:Q4_1"
            events = progress_events(http, body["task"]["id"])
            assert events and events[-1]["bytes"] == events[-1]["total"] == size
            reply = http.post(
                "/v1/responses", json={"model": MODEL, "input": "Say hi.", "max_output_tokens": 8}
            )
            assert reply.status_code == 200 and reply.json()["status"] in (
                "completed",
                "incomplete",
            )
            assert reply.json()["output"][0]["content"][0]["text"]
            again = http.post("/v1/models/pull", json={"from": REF})
            assert again.status_code == 409 and again.json()["error"]["code"] == "model_exists"
        assert leftovers(server.data_dir) == []
    finally:
        server.stop()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
    finally:
        conn.close()


@pytest.mark.slow
def test_a_kill_9_halfway_resumes_from_the_bytes_on_disk_after_the_restart(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    size = variant[0].stat().st_size
    hub = hub_factory(rate=size / 6)  # about six seconds for the whole file
    server = start(tmp_path, blob_cache, hub)
    try:
        with server.client() as http:
            task_id = http.post("/v1/models/pull", json={"from": REF}).json()["task"]["id"]
            # pulling the same reference again joins the same pull
            again = http.post("/v1/models/pull", json={"from": REF})
            assert again.status_code == 202 and again.json()["task"]["id"] == task_id

            def past_the_middle() -> bool:
                events = progress_events(http, task_id)
                return bool(events) and events[-1]["bytes"] > 0.6 * size

            wait_for(past_the_middle, "the pull to pass 60%")
        server.kill()
        killed_at = time.time()
        server.start()
        with server.client() as http:
            task = wait_for(lambda: finished(http, task_id), "the resumed pull")
            assert task["status"] == "completed", task
            assert task["attempt"] == 1  # resumed, not retried
            after = [r["start"] for r in hub.requests if r["at"] > killed_at]
            assert after and after[0] > size // 2, (after, size)
            assert http.get(f"/v1/models/{MODEL}").json()["digest"] == f"sha256:{variant[1]}"
        assert leftovers(server.data_dir) == []
    finally:
        server.stop()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
        log = task_log(conn, task_id)
        assert [e for e in log if e["type"] == "response.in_progress" and e.get("resumed")]
    finally:
        conn.close()


@pytest.mark.slow
def test_a_wrong_sha256_fails_with_digest_mismatch_and_leaves_nothing(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    hub = hub_factory(sha="0" * 64)
    secret = "hf_" + "k3y" * 10
    server = start(tmp_path, blob_cache, hub, HF_TOKEN=secret)
    try:
        with server.client() as http:
            task = pulled(http)
            assert task["status"] == "failed"
            assert task["error"]["code"] == "digest_mismatch", task
            assert http.get(f"/v1/models/{MODEL}").status_code == 404
        assert leftovers(server.data_dir) == []
        blobs = sorted(p.name for p in (server.data_dir / "blobs").iterdir())
        assert f"sha256-{variant[1]}" not in blobs and "sha256-" + "0" * 64 not in blobs
        # HF_TOKEN went to the hub with every request, and nowhere into the log
        assert hub.authorizations and set(hub.authorizations) == {f"Bearer {secret}"}
        assert secret not in server.log_path.read_text()
    finally:
        server.stop()


def test_a_file_redirected_to_another_host_is_fetched_without_the_token(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub]
) -> None:
    """The real hub sends a file's bytes from its CDN (a ``302`` to another host): the
    pull follows it, and ``HF_TOKEN`` stays with the hub."""
    hub = hub_factory(cdn=True)
    secret = "hf_" + "cdn" * 10
    server = start(tmp_path, blob_cache, hub, HF_TOKEN=secret)
    try:
        with server.client() as http:
            task = pulled(http)
            assert task["status"] == "completed", task
            assert http.get(f"/v1/models/{MODEL}").status_code == 200
        gets = [r for r in hub.requests if r["method"] == "GET"]
        assert gets and all(r["host"].startswith("localhost:") for r in gets)
        assert [r["authorization"] for r in gets] == [None] * len(gets)
        assert f"Bearer {secret}" in hub.authorizations  # the hub's own API had it
    finally:
        server.stop()


@pytest.mark.slow
def test_a_cancel_deletes_the_partial_file(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    hub = hub_factory(rate=variant[0].stat().st_size / 20)
    server = start(tmp_path, blob_cache, hub)
    try:
        with server.client() as http:
            task_id = http.post("/v1/models/pull", json={"from": REF}).json()["task"]["id"]
            wait_for(lambda: progress_events(http, task_id), "some progress")
            assert leftovers(server.data_dir), "a partial file while it downloads"
            # it shows in the activity (lmsp ps, the console), the task list and metrics
            [shown] = http.get("/v1/service/activity").json()["pulls"]
            assert shown["task_id"] == task_id and shown["model"] == MODEL
            assert 0 < shown["bytes"] < shown["total"]
            ps = lmsp(server, "ps")
            assert "Pulls" in ps.stdout and task_id in ps.stdout, ps.stdout
            assert task_id in lmsp(server, "tasks", "ls").stdout
            metrics = http.get("/metrics").text
            assert f'lmsp_model_pull_bytes{{model="{MODEL}"}}' in metrics
            http.post(f"/v1/tasks/{task_id}/cancel")
            task = wait_for(lambda: finished(http, task_id), "the cancel")
            assert task["status"] == "cancelled"
            wait_for(lambda: leftovers(server.data_dir) == [], "the partial file to go", 30)
            assert http.get(f"/v1/models/{MODEL}").status_code == 404
    finally:
        server.stop()


# -- the command ----------------------------------------------------------------------------------


def lmsp(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run(
        [sys.executable, "-m", "lmsp", *args, "--url", server.url, "--token", server.token],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow
def test_lmsp_pull_shows_progress_and_refuses_bad_references_in_one_line(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    hub = hub_factory(rate=variant[0].stat().st_size / 3)
    server = start(tmp_path, blob_cache, hub)
    try:
        done = lmsp(server, "pull", REF, "--id", "smol-variant")
        assert done.returncode == 0, done.stderr
        assert "pulling smol-variant" in done.stderr and "MB" in done.stderr
        assert done.stdout.startswith(f"pulled smol-variant: sha256:{variant[1]}")
        listed = lmsp(server, "models", "ls")
        assert "smol-variant" in listed.stdout and "Q4_1" in listed.stdout
        for ref, code in (
            ("hf.co/nobody/missing-GGUF:Q4_K_M", "repo_not_found"),
            (f"hf.co/{REPO}:Q5_K_M", "quant_not_found"),
            ("ollama.com/library/smollm2", "invalid_reference"),
        ):
            refused = lmsp(server, "pull", ref)
            assert refused.returncode == 1, refused
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: "), refused.stderr
            assert f"({code})" in lines[0]
        removed = lmsp(server, "models", "rm", "smol-variant")
        assert removed.returncode == 0, removed.stderr
    finally:
        server.stop()


# -- a full disk ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_disk_refuses_a_pull_up_front_or_fails_it_mid_way_and_deletes_the_partial(
    tmp_path: Path, blob_cache: Path, hub_factory: Callable[..., Hub], variant: tuple[Path, str]
) -> None:
    """On a real small filesystem (a tmpfs): too little room for the file is a ``507``
    before anything is written; a disk that fills up during the download fails the task
    (``insufficient_storage``), deletes its partial file, and the service stays healthy."""
    require_small_fs()
    size = variant[0].stat().st_size
    hub = hub_factory(rate=size / 8)
    with small_fs(tmp_path / "small", 160) as mount:
        data_dir = seed_by_symlink(mount / "data", blob_cache)
        server = Server(data_dir, env={"LMSP_HF_ENDPOINT": hub.url})
        server.log_path = tmp_path / "server.log"
        server.start()
        filler = mount / "filler"
        try:
            with server.client() as http:
                fill(filler, leave=size // 2)
                refused = http.post("/v1/models/pull", json={"from": REF})
                assert refused.status_code == 507, refused.text
                assert refused.json()["error"]["code"] == "insufficient_storage"
                assert http.get("/v1/tasks").json()["data"] == []  # nothing was written
                filler.unlink()

                task_id = http.post("/v1/models/pull", json={"from": REF}).json()["task"]["id"]
                wait_for(
                    lambda: any(e["bytes"] > size // 5 for e in progress_events(http, task_id)),
                    "a fifth of the file",
                )
                fill(filler)  # the disk is full now
                task = wait_for(lambda: finished(http, task_id), "the pull to fail")
                assert task["status"] == "failed", task
                assert task["error"]["code"] == "insufficient_storage", task
                assert leftovers(data_dir) == []
                assert http.get(f"/v1/models/{MODEL}").status_code == 404
                filler.unlink()
                wait_for(lambda: httpx.get(f"{server.url}/healthz").status_code == 200, "health")
                after = http.post("/v1/responses", json={"model": "lmsp-test", "input": "ok"})
                assert after.status_code == 200 and after.json()["status"] == "completed"
        finally:
            server.stop()
        conn = open_db(data_dir)
        try:
            check_log_invariants(conn)
        finally:
            conn.close()


# -- a split file ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split_parts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The bundled model written again as a split GGUF of two parts (gguf's writer, as
    llama.cpp's gguf-split would)."""
    return split_gguf(bundled_model_path(), tmp_path_factory.mktemp("split"), "SmolSplit-Q4_1")


@pytest.mark.slow
def test_a_split_gguf_is_pulled_whole_and_loads_from_its_parts(
    tmp_path: Path, blob_cache: Path, split_parts: list[Path]
) -> None:
    repo = "test-owner/SmolSplit-GGUF"
    files = [HubFile(f"Q4_1/{p.name}", p, p.stat().st_size, sha256_of(p)) for p in split_parts]
    hub = serve(Hub(repo, list(reversed(files))))  # listed out of order
    server = start(tmp_path, blob_cache, hub)
    try:
        with server.client(timeout=600) as http:
            body = {"from": f"hf.co/{repo}:q4_1", "id": "smol-split"}
            task_id = http.post("/v1/models/pull", json=body).json()["task"]["id"]
            task = wait_for(lambda: finished(http, task_id), "the pull")
            assert task["status"] == "completed", task
            model = http.get("/v1/models/smol-split").json()
            parts = model["metadata"]["parts"]
            assert [p["file"] for p in parts] == [p.name for p in split_parts]
            assert model["digest"] == files[0].sha256.join(("sha256:", ""))
            for part in parts:  # every part is a blob
                blob = server.data_dir / "blobs" / part["digest"].replace(":", "-")
                assert blob.stat().st_size == part["size"]
            reply = http.post(
                "/v1/responses",
                json={"model": "smol-split", "input": "Say hi.", "max_output_tokens": 8},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["output"][0]["content"][0]["text"]
            assert http.delete("/v1/models/smol-split").status_code == 200
            left = {p.name for p in (server.data_dir / "blobs").iterdir()}
            assert not any(p["digest"].replace(":", "-") in left for p in parts)
    finally:
        server.stop()
        hub.close()
