"""Round 4's hostile inputs of a remote model's ``tokenizer.json`` and of its tasks'
priority (issue 38), against a real server and the hostile upstream stand-in
(tests/upstream_standin.py), counting violations (the campaign fails once, at the end,
with all of them) and printing its figures.

- **Hostile tokenizers**: a file that is neither a GGUF nor JSON, JSON that is no
  tokenizer (an array, no ``model``, a ``model`` the tokenizers library cannot read), a
  ``tokenizer.json`` cut in half or empty, one that tokenizes otherwise than the
  upstream, a ``tokenizer_config.json`` beside it that is not JSON or whose chat template
  is broken Jinja, a directory, hub references (``hf.co/…``) the hub (a stand-in on
  loopback) does not have, and an address that is no hub reference: each a ``400`` with
  PROTOCOL.md's error shape, nothing written (no model, no new blob).
- **Then the good one**: the bundled model's ``tokenizer.json`` (built offline from its
  GGUF) is added, and tasks of every ``service_tier`` on it end with the stand-in's exact
  answer; every log stays whole.

``make test``: 24 adds and 6 answers; ``make torture`` (``LMSP_CAMPAIGN=long``): 240 and 60.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.campaigns.invariants import long_run, report
from tests.campaigns.test_round4_R38 import count_blobs, stand_text
from tests.helpers import Server, log_violations, seeded_data_dir
from tests.hub_standin import Hub, serve
from tests.remote_fixtures import refused_add, smollm_tokenizer_json
from tests.upstream_standin import StandIn

pytestmark = pytest.mark.slow

ADDS, ANSWERS = (240, 60) if long_run() else (24, 6)
MODEL = "remote-json"
TIERS = ("priority", "default", "flex", "auto", None)


def hostile_tokenizers(root: Path, rng: random.Random) -> list[tuple[str, str]]:
    """(name, path given) of each kind of hostile tokenizer, written under ``root``."""
    good = smollm_tokenizer_json(root / "good")
    text = good.read_text(encoding="utf-8")
    made: list[tuple[str, str]] = []

    def write(name: str, data: bytes | str, config: str | None = None) -> None:
        folder = root / name.replace(" ", "-")
        folder.mkdir(parents=True)
        path = folder / "tokenizer.json"
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        if config is not None:
            (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
        made.append((name, str(path)))

    write("random bytes", bytes(rng.randrange(256) for _ in range(4096)))
    write("empty", b"")
    write("json array", "[1, 2, 3]")
    write("no model", json.dumps({"version": "1.0", "added_tokens": []}))
    write("unreadable model", json.dumps({"model": {"type": "Nonsense", "vocab": 7}}))
    write("cut in half", text[: len(text) // 2])
    write("config not json", text, config="{chat_template: nope")
    write("broken template", text, config=json.dumps({"chat_template": "{% for x in %}"}))
    mismatched = smollm_tokenizer_json(root / "mismatched", prefix_space=True)
    made.append(("tokenizes otherwise", str(mismatched)))
    made.append(("a directory", str(root / "good")))
    made.append(("missing", str(root / "nowhere" / "tokenizer.json")))
    for reference in (
        "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        "https://hf.co/x/y.json",
        "https://example.com/tokenizer.json",
    ):
        made.append((f"to fetch {reference[:10]}", reference))
    return made


def test_hostile_tokenizer_json_adds_then_every_tier_answers(
    tmp_path: Path, blob_cache: Path
) -> None:
    rng = random.Random(3838)
    stand = StandIn()
    kinds = hostile_tokenizers(tmp_path / "tokenizers", rng)
    hub = serve(Hub("nobody/nothing", []))  # the hub has none of the references
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache), {"LMSP_HF_ENDPOINT": hub.url})
    violations: list[str] = []
    counts: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    remote = {"url": stand.url, "upstream_model": "m", "inflight": 2}

    def add(http: httpx.Client, path: str) -> httpx.Response:
        return http.post("/v1/models", json={"id": MODEL, "path": path, "remote": remote})

    try:
        server.start()
        blobs = count_blobs(server)
        with server.client(timeout=300) as http:
            for i in range(ADDS):
                name, path = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
                answer = add(http, path)
                key = f"{name}:{answer.status_code}"
                counts[key] = counts.get(key, 0) + 1
                violations += refused_add(http, name, answer, MODEL)
            if count_blobs(server) != blobs:
                violations.append("a refused add left a blob")
            added = add(http, str(tmp_path / "tokenizers" / "good" / "tokenizer.json"))
            assert added.status_code == 201, added.text
            expected = stand_text(stand)
            for i in range(ANSWERS):
                tier = TIERS[i % len(TIERS)]
                body = {"model": MODEL, "input": "hi", "temperature": 0, "service_tier": tier}
                done = http.post("/v1/responses", json=body).json()
                key = f"{tier}:{done.get('status')}"
                outcomes[key] = outcomes.get(key, 0) + 1
                if done.get("status") != "completed" or answered(done) != expected:
                    violations.append(f"tier {tier}: {done.get('status')} {answered(done)!r}")
        violations += log_violations(server.data_dir)
    finally:
        server.stop()
        stand.close()
        hub.close()
    report(f"round4 r38b: {ADDS} hostile tokenizer adds {dict(sorted(counts.items()))}")
    report(f"round4 r38b: {ANSWERS} answers by tier {dict(sorted(outcomes.items()))}")
    report(f"round4 r38b: {len(violations)} violations")
    assert not violations, violations


def answered(done: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for o in done.get("output", []) for c in o.get("content", []))
