"""Round 4's hostile inputs of remote models (issue 38), against a real server, counting
violations (the campaign fails once, at the end, with all of them) and printing its
figures.

- **Hostile adds**: a remote model added with a URL that is no URL or reaches nothing, a
  bad key variable name, ``inflight`` out of bounds or of the wrong type, fields too many
  or missing, a tokenizer that is missing or no GGUF, an upstream (the stand-in of
  tests/upstream_standin.py) that tokenizes otherwise or answers junk: each a ``400``
  with PROTOCOL.md's error shape, nothing written (no model, no new blob).
- **Hostile streams**: the stand-in cut short, sending a line that is not JSON, a token
  id outside the vocabulary, a 500, a 400, between well-formed answers: each task ends
  (``engine_crashed`` naming the upstream, or ``engine_error``), a well-formed answer
  after any of them is exact, and every log stays whole.

``make test``: 24 adds and 12 streams; ``make torture`` (``LMSP_CAMPAIGN=long``): 240
and 120.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmsp.bootstrap import bundled_model_path
from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, log_violations, seeded_data_dir
from tests.remote_fixtures import refused_add
from tests.upstream_standin import MODES, StandIn

pytestmark = pytest.mark.slow

ADDS, STREAMS = (240, 120) if long_run() else (24, 12)
MODEL = "remote-standin"


def hostile_bodies(stand: StandIn, garbage: Path) -> list[tuple[str, Callable[[], Any]]]:
    """(name, body maker) of each kind of hostile add; the maker may switch the
    stand-in's mode first."""
    good = {"url": stand.url, "upstream_model": "m", "inflight": 2}
    path = str(bundled_model_path())

    def body(remote: Any, tokenizer: str = path, mode: str = "ok") -> Callable[[], Any]:
        def make() -> Any:
            stand.mode = mode
            return {"id": MODEL, "path": tokenizer, "remote": remote}

        return make

    return [
        ("url not http", body({**good, "url": "ftp://127.0.0.1:1/"})),
        ("url empty host", body({**good, "url": "http://"})),
        ("url with spaces", body({**good, "url": "http://a b/"})),
        ("url too long", body({**good, "url": "http://h/" + "a" * 5000})),
        ("unreachable", body({**good, "url": "http://127.0.0.1:9"})),
        ("key variable", body({**good, "api_key_env": "NOT-A-NAME"})),
        ("inflight 0", body({**good, "inflight": 0})),
        ("inflight huge", body({**good, "inflight": 10**6})),
        ("inflight text", body({**good, "inflight": "4"})),
        ("inflight above slots", body({**good, "inflight": 64})),
        ("extra field", body({**good, "weights": "x"})),
        ("no upstream model", body({"url": stand.url})),
        ("remote not an object", body([stand.url])),
        ("tokenizer missing", body(good, tokenizer=str(garbage) + ".none")),
        ("tokenizer not gguf", body(good, tokenizer=str(garbage))),
        ("mistokenizes", body(good, mode="mistokenize")),
        ("answers junk", body(good, mode="nonsense")),
    ]


def count_blobs(server: Server) -> int:
    return len(list((server.data_dir / "blobs").iterdir()))


def test_hostile_adds_and_streams_of_a_remote_model(tmp_path: Path, blob_cache: Path) -> None:
    rng = random.Random(38)
    stand = StandIn()
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(rng.randrange(256) for _ in range(4096)))
    server = Server(
        seeded_data_dir(tmp_path / "data", blob_cache), env={"LMSP_ENGINE_RESTARTS": "100000"}
    )
    violations: list[str] = []
    kinds = hostile_bodies(stand, garbage)
    counts: dict[str, int] = {}
    try:
        server.start()
        blobs = count_blobs(server)
        with server.client(timeout=300) as http:
            for i in range(ADDS):
                name, make = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
                answer = http.post("/v1/models", json=make())
                counts[answer.status_code] = counts.get(answer.status_code, 0) + 1
                violations += refused_add(http, name, answer, MODEL)
            if count_blobs(server) != blobs:
                violations.append("a refused add left a blob")
            stand.mode = "ok"
            added = http.post(
                "/v1/models",
                json={
                    "id": MODEL,
                    "path": str(bundled_model_path()),
                    "remote": {"url": stand.url, "upstream_model": "m", "inflight": 2},
                },
            )
            assert added.status_code == 201, added.text
            expected = stand_text(stand)
            outcomes: dict[str, int] = {}
            for i in range(STREAMS):
                mode = MODES[i % len(MODES)] if i < len(MODES) else rng.choice(MODES)
                stand.mode = mode
                body = {"model": MODEL, "input": "hi", "temperature": 0, "on_restart": "fail"}
                done = http.post("/v1/responses", json=body).json()
                outcomes[f"{mode}:{done['status']}"] = (
                    outcomes.get(f"{mode}:{done['status']}", 0) + 1
                )
                text = "".join(
                    c.get("text", "") for o in done.get("output", []) for c in o.get("content", [])
                )
                if mode == "ok" and (done["status"] != "completed" or text != expected):
                    violations.append(f"stream ok: {done['status']} {text!r} {done.get('error')}")
                if mode in ("garbage", "oov", "cut", "http500"):
                    error = done.get("error") or {}
                    if done["status"] != "failed" or error.get("code") != "engine_crashed":
                        violations.append(f"stream {mode}: {done['status']} {error}")
                    elif stand.url not in error.get("message", ""):
                        violations.append(f"stream {mode}: the upstream is not named: {error}")
                if mode == "http400" and done["status"] != "failed":
                    violations.append(f"stream {mode}: {done['status']}")
        violations += log_violations(server.data_dir)
    finally:
        server.stop()
        stand.close()
    report(f"round4 R38: {ADDS} hostile adds {dict(sorted(counts.items()))}")
    report(f"round4 R38: {STREAMS} hostile streams {dict(sorted(outcomes.items()))}")
    report(f"round4 R38: {len(violations)} violations")
    assert not violations, violations


def stand_text(stand: StandIn) -> str:
    return bytes(stand.tokenizer.llm.detokenize(stand.answer)).decode("utf-8")


def test_an_upstream_that_keeps_breaking_off_fails_its_model_after_a_crash_loop(
    tmp_path: Path, blob_cache: Path
) -> None:
    """``LMSP_ENGINE_RESTARTS=2``: the third time the upstream breaks off, the model is
    failed (``/healthz`` says so) and a task on it fails saying why; ``POST
    /v1/models/{id}/verify`` clears it."""
    stand = StandIn()
    server = Server(
        seeded_data_dir(tmp_path / "data", blob_cache), env={"LMSP_ENGINE_RESTARTS": "2"}
    )
    try:
        server.start()
        with server.client(timeout=300) as http:
            remote = {"url": stand.url, "upstream_model": "m", "inflight": 2}
            body = {"id": MODEL, "path": str(bundled_model_path()), "remote": remote}
            assert http.post("/v1/models", json=body).status_code == 201
            stand.mode = "cut"
            ask = {"model": MODEL, "input": "hi", "temperature": 0, "on_restart": "fail"}
            for _ in range(3):
                done = http.post("/v1/responses", json=ask).json()
                assert done["status"] == "failed" and stand.url in done["error"]["message"]
            stand.mode = "ok"
            refused = http.post("/v1/responses", json=ask).json()
            assert refused["status"] == "failed", refused
            assert "crashed 3 times" in refused["error"]["message"], refused["error"]
            engines = http.get("/healthz").json()
            assert "failed" in str(engines), engines
            assert http.post(f"/v1/models/{MODEL}/verify").json()["status"] == "ready"
            again = http.post("/v1/responses", json=ask).json()
            assert again["status"] == "completed", again
    finally:
        server.stop()
        stand.close()
