"""Round 4's hostile inputs of pulls, compaction items and call ids (issue 36: items 6, 8,
10 and 12a), against real servers, counting violations (a campaign fails once, at the
end, with all of them) and printing its figures.

- **A hub that sends fewer bytes than it lists** (tests/hub_standin.py on loopback):
  listed larger than it is, headers and no byte, half of what is asked, a cut then
  ``416``. Each pull must fail ``hub_error`` after exactly ``MAX_FAILURES`` requests of
  its file, each after a back-off, leaving no part file.
- **A hub that trickles a byte a second**: a cancel must end the pull (``cancelled``,
  its part file gone) within 30 s; in the long run a ``SIGTERM`` too (the pull logs
  its stop, and resumes after the restart).
- **Forged compaction items**: unkeyed (as lmsp's earlier check), keyed with a random
  tag, a genuine item with one character changed or its count rewritten, garbage, other
  JSON types: each a ``400`` naming ``input.1.encrypted_content``, nothing written; the
  genuine items are read back.
- **Repeated call ids** in Anthropic, Responses and Chat histories of 1 to 5 calls: a
  repeated id is a ``400`` naming exactly the second; a history without one is served.

``make test``: one round of each pull mode and one trickle cancel, 40 forged items, 40
histories; ``make torture`` (``LMSP_CAMPAIGN=long``): 3 rounds, 3 cancels and 2
shutdowns from the trickle, 400 forged items, 400 histories.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import random
import string
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.outbound.pull import MAX_FAILURES
from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, check_log_invariants, open_db, seeded_data_dir
from tests.hub_standin import Hub, HubFile, serve, sha256_of, variant_gguf

pytestmark = pytest.mark.slow

REPO = "round4/Smol-GGUF"
SHORT = {"Q2_K": "longer", "Q3_K_S": "empty", "Q5_0": "half", "Q6_K": "416"}
TRICKLE = "Q4_0"
ROUNDS, TRICKLES, SHUTDOWNS = (3, 3, 2) if long_run() else (1, 1, 0)
CASES = 400 if long_run() else 40
MODEL = "lmsp-test"


def hostile_hub(source: Path) -> Hub:
    size, sha = source.stat().st_size, sha256_of(source)
    files = [
        HubFile(
            f"Smol.{tag}.gguf",
            source,
            size + (1 << 20) if mode == "longer" else size,
            sha,
            None if mode == "longer" else mode,
        )
        for tag, mode in SHORT.items()
    ]
    files.append(HubFile(f"Smol.{TRICKLE}.gguf", source, size, sha, trickle=1.0))
    return serve(Hub(REPO, files))


class Figures:
    def __init__(self) -> None:
        self.violations: list[str] = []
        self.pulls = 0
        self.requests = 0
        self.took: list[float] = []  # seconds from accepted to failed
        self.cancels: list[float] = []
        self.shutdowns: list[float] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.violations.append(what)


def status(http: httpx.Client, task_id: str) -> dict[str, Any]:
    task: dict[str, Any] = http.get(f"/v1/tasks/{task_id}").json()
    return task


def wait_status(
    http: httpx.Client, task_id: str, wanted: tuple[str, ...], timeout: float
) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = status(http, task_id)
        if task["status"] in wanted:
            return task
        time.sleep(0.05)
    return None


def leftovers(data_dir: Path, task_id: str) -> bool:
    return (data_dir / "pulls" / task_id).exists()


def short_round(server: Server, hub: Hub, figs: Figures) -> None:
    """Every short mode once, as the service runs them (two at a time)."""
    before = {tag: hub.gets(f"Smol.{tag}.gguf") for tag in SHORT}
    started = time.monotonic()
    with server.client() as http:
        tasks = {}
        for tag in SHORT:
            answer = http.post("/v1/models/pull", json={"from": f"hf.co/{REPO}:{tag}"})
            figs.check(answer.status_code == 202, f"{tag}: pull refused {answer.text}")
            if answer.status_code == 202:
                tasks[tag] = answer.json()["task"]["id"]
        for tag, task_id in tasks.items():
            name = f"Smol.{tag}.gguf"
            task = wait_status(http, task_id, ("completed", "failed", "cancelled"), 240)
            figs.pulls += 1
            if task is None:
                figs.check(False, f"{tag}: the pull did not end in 240 s")
                http.post(f"/v1/tasks/{task_id}/cancel")
                continue
            figs.took.append(time.monotonic() - started)
            error = task.get("error") or {}
            figs.check(task["status"] == "failed", f"{tag}: ended {task['status']}")
            figs.check(error.get("code") == "hub_error", f"{tag}: error {error}")
            figs.check(name in error.get("message", ""), f"{tag}: message {error}")
            asked = hub.gets(name) - before[tag]
            figs.requests += asked
            figs.check(asked == MAX_FAILURES, f"{tag}: {asked} requests of the file")
            times = [r["at"] for r in hub.requests if r["path"] == name][before[tag] :]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            figs.check(all(g > 0.3 for g in gaps), f"{tag}: requests {gaps} s apart")
            figs.check(not leftovers(server.data_dir, task_id), f"{tag}: a part file stayed")


def trickling_pull(server: Server, hub: Hub, figs: Figures) -> str | None:
    name = f"Smol.{TRICKLE}.gguf"
    before = hub.gets(name)
    with server.client() as http:
        answer = http.post("/v1/models/pull", json={"from": f"hf.co/{REPO}:{TRICKLE}"})
        if answer.status_code != 202:
            figs.check(False, f"trickle: pull refused {answer.text}")
            return None
        task_id: str = answer.json()["task"]["id"]
        figs.check(wait_status(http, task_id, ("running",), 60) is not None, "trickle: not run")
    deadline = time.monotonic() + 60
    while hub.gets(name) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # its first 64 KiB are read; the next read waits on the trickle
    return task_id


def cancel_trickle(server: Server, hub: Hub, figs: Figures) -> None:
    task_id = trickling_pull(server, hub, figs)
    if task_id is None:
        return
    with server.client() as http:
        asked = time.monotonic()
        http.post(f"/v1/tasks/{task_id}/cancel")
        task = wait_status(http, task_id, ("cancelled", "failed", "completed"), 30)
        figs.check(task is not None and task["status"] == "cancelled", f"trickle cancel: {task}")
        figs.cancels.append(time.monotonic() - asked)
    deadline = time.monotonic() + 30
    while leftovers(server.data_dir, task_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    figs.check(not leftovers(server.data_dir, task_id), "trickle cancel: a part file stayed")


def shutdown_trickle(server: Server, hub: Hub, figs: Figures) -> None:
    task_id = trickling_pull(server, hub, figs)
    if task_id is None:
        return
    began = time.monotonic()
    server.stop()
    figs.shutdowns.append(time.monotonic() - began)
    stopped = f"pull {task_id}: stopped for the shutdown" in server.log_path.read_text()
    figs.check(stopped, "trickle shutdown: the pull held its read past the shutdown")
    server.start()
    with server.client() as http:
        figs.check(wait_status(http, task_id, ("running",), 60) is not None, "not resumed")
        http.post(f"/v1/tasks/{task_id}/cancel")
        task = wait_status(http, task_id, ("cancelled", "failed", "completed"), 30)
        figs.check(task is not None and task["status"] == "cancelled", f"resumed cancel: {task}")


def test_round4_hostile_hub_campaign(tmp_path: Path, blob_cache: Path) -> None:
    from lmsp.bootstrap import bundled_model_path

    source = variant_gguf(bundled_model_path(), tmp_path / "variant.gguf")
    hub = hostile_hub(source)
    env = {"LMSP_HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_" + "r4p" * 10}
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache), env=env).start()
    figs = Figures()
    try:
        for _ in range(ROUNDS):
            short_round(server, hub, figs)
        for _ in range(TRICKLES):
            cancel_trickle(server, hub, figs)
        for _ in range(SHUTDOWNS):
            shutdown_trickle(server, hub, figs)
    finally:
        server.stop()
        hub.close()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
    finally:
        conn.close()
    per = figs.requests / max(figs.pulls, 1)
    report(
        f"round-4 pulls campaign (hostile hub): {figs.pulls} pulls from hubs sending fewer"
        f" bytes than they list, {figs.requests} file requests ({per:.1f} a pull, limit"
        f" {MAX_FAILURES}), failed within {max(figs.took, default=0):.0f} s;"
        f" {len(figs.cancels)} cancels from a trickling hub in at most"
        f" {max(figs.cancels, default=0):.2f} s, {len(figs.shutdowns)} SIGTERMs in at most"
        f" {max(figs.shutdowns, default=0):.2f} s; {len(figs.violations)} violations"
    )
    assert not figs.violations, figs.violations[:20]


# -- forged compaction items and repeated call ids ------------------------------------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def forged(rng: random.Random, genuine: str) -> Any:
    """One ``encrypted_content`` lmsp did not write."""
    summary = "".join(rng.choices(string.printable, k=rng.randrange(0, 40)))
    count = rng.choice([0, -1, 1, 3, 10**6 + 1, 10**15, 2**70, 1.5, "3", None, True])
    body = b64(json.dumps({"summary": summary, "items": count}).encode())
    version, payload, tag = genuine.split(".")
    kind = rng.randrange(7)
    if kind == 0:  # unkeyed, as lmsp's earlier check computed it
        digest = hashlib.sha256(body.encode()).hexdigest()[:32]
        return f"{rng.choice(['lmspc1', 'lmspc2'])}.{body}.{digest}"
    if kind == 1:  # a random tag
        return f"lmspc2.{body}.{rng.randbytes(32).hex()}"
    if kind == 2:  # one character of the genuine item changed
        at = rng.randrange(len(genuine))
        if genuine[at] == ".":
            at -= 1
        swap = rng.choice([c for c in string.ascii_letters + string.digits if c != genuine[at]])
        return genuine[:at] + swap + genuine[at + 1 :]
    if kind == 3:  # the genuine tag on a rewritten count
        raw = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        raw["items"] = rng.choice([10**15, raw["items"] + 1, 0])
        return f"{version}.{b64(json.dumps(raw, separators=(',', ':')).encode())}.{tag}"
    if kind == 4:  # garbage in the shape
        parts = rng.randrange(1, 6)
        pieces = ["lmspc2", body, tag, "", "x" * rng.randrange(9)]
        return ".".join(rng.choice(pieces) for _ in range(parts))
    if kind == 5:  # longer than lmsp writes
        return f"lmspc2.{'A' * rng.randrange(65_536, 80_000)}.{tag}"
    return rng.choice([5, None, [], {}, True, genuine.encode().hex()])  # not a compaction


def compacted(http: httpx.Client, rng: random.Random) -> dict[str, Any]:
    words = " ".join(rng.choices(["tea", "Ada", "blue", "seven", "Oslo"], k=6))
    given = [
        {"role": "user", "content": f"Remember: {words}."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "And?"},
    ]
    answer = http.post("/v1/responses/compact", json={"model": MODEL, "input": given})
    assert answer.status_code == 200, answer.text
    first: dict[str, Any] = answer.json()["output"][0]
    return first


def task_count(http: httpx.Client) -> int:
    return len(http.get("/v1/tasks", params={"limit": 100}).json()["data"])


def forged_items(server: Server, rng: random.Random, figs: Figures) -> tuple[int, int]:
    refused = genuine_read = 0
    with server.client() as http:
        genuine = [compacted(http, rng) for _ in range(3)]
        before = task_count(http)
        for _ in range(CASES):
            real = rng.choice(genuine)
            content = forged(rng, real["encrypted_content"])
            lead = {"role": "user", "content": "Hi."}
            body = {"model": MODEL, "input": [lead, {**real, "encrypted_content": content}]}
            answer = http.post("/v1/responses", json=body)
            ok = answer.status_code == 400
            if ok:
                ok = str(answer.json()["error"].get("param")).startswith("input.1")
            figs.check(ok, f"forged {content!r:.80}: {answer.status_code} {answer.text[:200]}")
            refused += ok
        figs.check(task_count(http) == before, "a forged compaction item wrote a task")
        for real in genuine:
            body = {"model": MODEL, "input": [real, {"role": "user", "content": "Go on."}]}
            answer = http.post("/v1/responses", json={**body, "max_output_tokens": 4})
            figs.check(answer.status_code == 200, f"genuine refused: {answer.text[:200]}")
            genuine_read += answer.status_code == 200
    return refused, genuine_read


def calls(rng: random.Random) -> tuple[list[list[str]], tuple[int, int] | None]:
    """Turns of call ids (1 to 3 turns of 1 or 2 calls) and where a repeat was put
    (turn, place in the turn), or ``None``."""
    turns = [[f"c{t}{k}" for k in range(rng.randint(1, 2))] for t in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        return turns, None
    flat = [(t, k) for t, turn in enumerate(turns) for k in range(len(turn))]
    t, k = rng.choice(flat)
    target = rng.randrange(t, len(turns))  # the repeat comes after the first
    place = rng.randint(k + 1 if target == t else 0, len(turns[target]))
    turns[target].insert(place, turns[t][k])
    return turns, (target, place)


def anthropic_body(turns: list[list[str]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    for turn in turns:
        uses = [{"type": "tool_use", "id": c, "name": "w", "input": {}} for c in turn]
        messages.append({"role": "assistant", "content": uses})
        answers = [
            {"type": "tool_result", "tool_use_id": c, "content": "ok"} for c in dict.fromkeys(turn)
        ]
        messages.append({"role": "user", "content": answers})
    return {"model": MODEL, "max_tokens": 4, "messages": messages}


def responses_body(turns: list[list[str]]) -> dict[str, Any]:
    given: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    for turn in turns:
        given += [
            {"type": "function_call", "call_id": c, "name": "w", "arguments": "{}"} for c in turn
        ]
        given += [
            {"type": "function_call_output", "call_id": c, "output": "ok"}
            for c in dict.fromkeys(turn)
        ]
    return {"model": MODEL, "max_output_tokens": 4, "input": given}


def chat_body(turns: list[list[str]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    for turn in turns:
        tool_calls = [
            {"id": c, "type": "function", "function": {"name": "w", "arguments": "{}"}}
            for c in turn
        ]
        messages.append({"role": "assistant", "tool_calls": tool_calls})
        messages += [
            {"role": "tool", "tool_call_id": c, "content": "ok"} for c in dict.fromkeys(turn)
        ]
    return {"model": MODEL, "max_tokens": 4, "messages": messages}


def expected(route: str, turns: list[list[str]], where: tuple[int, int]) -> str:
    """The ``param`` naming the repeat at ``where``."""
    target, place = where
    if route == "/v1/responses":
        index = 1 + sum(len(t) + len(dict.fromkeys(t)) for t in turns[:target]) + place
        return f"input.{index}.call_id"
    message = 1
    for turn in turns[:target]:
        message += 2 if route == "/v1/messages" else 1 + len(dict.fromkeys(turn))
    if route == "/v1/messages":
        return f"messages.{message}.content.{place}.id"
    return f"messages.{message}.tool_calls.{place}.id"


ROUTES = {
    "/v1/messages": anthropic_body,
    "/v1/responses": responses_body,
    "/v1/chat/completions": chat_body,
}


def repeated_calls(server: Server, rng: random.Random, figs: Figures) -> tuple[int, int]:
    refused = served = 0
    with server.client() as http:
        for _ in range(CASES):
            route = rng.choice(list(ROUTES))
            turns, where = calls(rng)
            body = ROUTES[route](turns)
            answer = http.post(route, json=body)
            if where is None:
                figs.check(answer.status_code == 200, f"{route} {turns}: {answer.text[:200]}")
                served += answer.status_code == 200
                continue
            want = expected(route, turns, where)
            text = answer.text
            if route == "/v1/messages":
                ok = answer.status_code == 400 and answer.json()["error"]["message"].startswith(
                    f"{want}: "
                )
            else:
                ok = answer.status_code == 400 and answer.json()["error"]["param"] == want
            figs.check(ok, f"{route} {turns} (repeat at {want}): {answer.status_code} {text[:200]}")
            refused += ok
    return refused, served


def test_round4_forged_compactions_and_repeated_call_ids(tmp_path: Path, blob_cache: Path) -> None:
    seed = int(os.environ.get("LMSP_ROUND4_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache)).start()
    figs = Figures()
    try:
        forged_refused, genuine = forged_items(server, rng, figs)
        calls_refused, served = repeated_calls(server, rng, figs)
    finally:
        server.stop()
    conn = open_db(server.data_dir)
    try:
        check_log_invariants(conn)
    finally:
        conn.close()
    report(
        f"round-4 pulls campaign (forged inputs): {forged_refused} of {CASES} forged compaction"
        f" items refused, {genuine} genuine read back; {calls_refused} histories with a"
        f" repeated call id refused (Anthropic, Responses, Chat), {served} without served;"
        f" {len(figs.violations)} violations [LMSP_ROUND4_SEED={seed}]"
    )
    assert not figs.violations, figs.violations[:20]
