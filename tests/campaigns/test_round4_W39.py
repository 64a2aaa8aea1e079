"""Round 4, issue 39: hostile WebSocket clients and damaged PDFs against a real server.

Generated (a seeded random walk): sockets that send ``response.create`` frames with
random bodies — refused fields, bad JSON, deep nesting, lone surrogates, binary frames,
unknown frame types, huge or empty inputs, ``previous_response_id`` of this socket's
``store: false`` responses, of another socket's, of stored ones and of none, orphan tool
outputs, idempotency keys used twice — and that close mid-turn, stop reading, or open
past their client's limit; and PDFs cut, with their xref stripped, their lengths wrong,
bytes flipped, bombs without their xref. Counted as violations:

- a turn that ends with anything but exactly one terminal event or exactly one error
  envelope (``{"type": "error", "status", "error": {"code", "message", "param"}}``), or
  with frames after it, or sequence numbers that go back;
- a ``5xx`` envelope or HTTP answer, an answer without section 8's shape;
- a ``store: false`` continuation that works on a socket other than its own;
- a stored turn cancelled because its socket dropped; a task left unfinished; a
  ``store: false`` response still on disk once everything finished; a data directory
  that fails the campaigns' invariants.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) 400 steps.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests import hostile
from tests.campaigns.invariants import Ledger, check, long_run, report, wait_all_finished
from tests.helpers import Server, open_db

pytestmark = pytest.mark.slow

STEPS = 400 if long_run() else 40
MODEL = "lmsp-test"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
SOCKETS = 4  # per client (LMSP_WS_PER_CLIENT): the campaign tries a fifth


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "LMSP_TEST_ENGINE_DELAY": "0.002",
        "LMSP_WS_PER_CLIENT": str(SOCKETS),
        "LMSP_WS_CACHE_BYTES": "6000",
        "LMSP_WS_SEND_TIMEOUT": "2s",
        "LMSP_MAX_BODY_BYTES": str(256 << 10),
        "LMSP_FILE_CPU_TIME": "2s",
    }
    srv = Server(tmp_path_factory.mktemp("round4-w39") / "data", env=env)
    srv.start()
    yield srv
    srv.stop()


class Walk:
    """The campaign's state: its open sockets, what each may continue, what it saw."""

    def __init__(self, server: Server, seed: int) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.url = server.url.replace("http://", "ws://") + "/v1/responses"
        self.sockets: list[tuple[ClientConnection, list[str]]] = []  # with their ids
        self.stored: list[str] = []
        self.foreign: list[str] = []  # store: false ids of sockets now closed
        self.bad: list[str] = []
        self.counts = {"turns": 0, "envelopes": 0, "drops": 0, "pdfs": 0, "refused": 0}

    def open(self) -> ClientConnection | None:
        headers = {"Authorization": f"Bearer {self.server.token}"}
        try:
            ws = connect(self.url, additional_headers=headers, max_size=None, open_timeout=60)
        except InvalidStatus as exc:
            body = json.loads(exc.response.body or b"{}")
            code = (body.get("error") or {}).get("code")
            if exc.response.status_code != 429 or code != "too_many_websockets":
                self.bad.append(f"upgrade refused {exc.response.status_code} {code}")
            self.counts["refused"] += 1
            return None
        self.sockets.append((ws, []))
        return ws

    def close(self, index: int, mid_turn: bool) -> None:
        ws, ids = self.sockets.pop(index)
        if mid_turn:  # a stored turn, dropped after its first event: it must finish
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "drop"}))
            first = json.loads(ws.recv(timeout=120))
            if first.get("type") == "response.created":
                self.stored.append(first["response"]["id"])
            self.counts["drops"] += 1
        ws.close()
        self.foreign += ids

    def frame(self, ids: list[str]) -> tuple[str | bytes, str]:
        """A frame, and what it must end in: ``ok`` (a terminal event), ``error`` (an
        envelope), ``any`` (either), ``not_found`` (previous_response_not_found)."""
        rng = self.rng
        body: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": "hi"}
        body["max_output_tokens"] = rng.choice([1, 4, 16])
        body["store"] = rng.random() < 0.5
        pick = rng.randrange(13)
        if pick == 0:
            return rng.choice(["", "{", "[1]", "null", '"x"', "{}" * 3]), "error"
        if pick == 1:
            return json.dumps(
                body
                | {
                    rng.choice(
                        ["stream", "background", "stream_options", "generate", "stream_id"]
                    ): True
                }
            ), "error"
        if pick == 2:
            return json.dumps(body | {"type": rng.choice(["response.steer", 7, None])}), "error"
        if pick == 3:
            return '{"type":"response.create","input":' + "[" * 5000 + "]" * 5000 + "}", "error"
        if pick == 4:
            return '{"type":"response.create","model":"x","input":"\\ud800"}', "error"
        if pick == 5:
            return json.dumps(body).encode(), "ok"  # a binary frame: read as UTF-8
        if pick == 6 and ids:
            return json.dumps(
                body | {"store": False, "previous_response_id": rng.choice(ids)}
            ), "any"
        if pick == 7 and self.foreign:
            chosen = rng.choice(self.foreign)
            return json.dumps(body | {"previous_response_id": chosen}), "not_found"
        if pick == 8 and self.stored:
            # a stored turn still running (dropped) is 409 response_in_progress
            return json.dumps(body | {"previous_response_id": rng.choice(self.stored)}), "any"
        if pick == 9:
            orphan = {"type": "function_call_output", "call_id": "call_x", "output": "o"}
            return json.dumps(body | {"input": [orphan]}), "error"
        if pick == 10:
            key = f"k{rng.randrange(3)}"
            return json.dumps(body | {"store": True, "metadata": {"idempotency_key": key}}), "any"
        if pick == 11:
            return json.dumps(body | {"input": "x" * rng.choice([0, 3000])}), "any"
        return json.dumps(body | {"input": hostile.pdf_input(self.pdf())}), "any"

    def pdf(self) -> bytes:
        rng = self.rng
        self.counts["pdfs"] += 1
        base = hostile.damaged_pdf() if rng.random() < 0.5 else hostile.page_pdf(b"BT (a) Tj ET")
        damage = rng.randrange(5)
        if damage == 0:
            return base[: rng.randrange(1, len(base))]
        if damage == 1:
            return hostile.without_xref(base)
        if damage == 2:
            return base.replace(b"/Length ", b"/Length 9")
        if damage == 3:
            spot = rng.randrange(len(base))
            return base[:spot] + bytes([rng.randrange(256)]) + base[spot + 1 :]
        return hostile.without_xref(hostile.text_bomb(1 << 20))

    def turn(self, ws: ClientConnection, ids: list[str]) -> None:
        frame, expected = self.frame(ids)
        ws.send(frame)
        frames = []
        while True:
            frames.append(json.loads(ws.recv(timeout=300)))
            kind = frames[-1].get("type")
            if kind in TERMINAL or kind == "error":
                break
        self.counts["turns"] += 1
        self.judge(frames, expected, ids, frame)
        try:  # nothing may follow the end of a turn
            extra = ws.recv(timeout=0.05)
            self.bad.append(f"a frame after the end of a turn: {str(extra)[:120]}")
        except TimeoutError:
            pass

    def judge(
        self, frames: list[dict[str, Any]], expected: str, ids: list[str], frame: str | bytes
    ) -> None:
        last = frames[-1]
        shown = str(frame)[:80]
        if last["type"] == "error":
            self.counts["envelopes"] += 1
            error = last.get("error") or {}
            if len(frames) != 1 or set(last) != {"type", "status", "error"}:
                self.bad.append(f"envelope {last} after {len(frames) - 1} events ({shown})")
            elif not {"code", "message", "param"} <= set(error) or last["status"] >= 500:
                self.bad.append(f"envelope {last} ({shown})")
            elif expected == "ok" or (
                expected == "not_found" and error["code"] != "previous_response_not_found"
            ):
                self.bad.append(f"{error['code']} where {expected} was due ({shown})")
            return
        numbers = [f["sequence_number"] for f in frames]
        if numbers != sorted(set(numbers)) or frames[0]["type"] != "response.created":
            self.bad.append(f"events out of order: {numbers} ({shown})")
        if expected in ("error", "not_found"):
            self.bad.append(f"a turn ran where {expected} was due ({shown})")
        response = last["response"]
        if response.get("store") is False and last["type"] != "response.failed":
            ids.append(response["id"])
        elif response.get("store") is not False:
            self.stored.append(response["id"])

    def step(self, http: httpx.Client) -> None:
        rng = self.rng
        action = rng.random()
        if not self.sockets or action < 0.08:
            self.open()
        elif action < 0.14:
            self.close(rng.randrange(len(self.sockets)), mid_turn=rng.random() < 0.5)
        else:
            ws, ids = rng.choice(self.sockets)
            self.turn(ws, ids)


def store_false_left(server: Server) -> int:
    with open_db(server.data_dir) as conn:
        return int(conn.execute("SELECT count(*) FROM responses WHERE store = 0").fetchone()[0])


def test_round4_websocket_campaign(server: Server) -> None:
    started = time.monotonic()
    walk = Walk(server, seed=39)
    for _ in range(SOCKETS + 1):  # the last one past the client's limit: 429
        walk.open()
    with server.client(timeout=600) as http:
        for _ in range(STEPS):
            try:
                walk.step(http)
            except (ConnectionClosed, TimeoutError) as exc:
                walk.bad.append(f"a socket failed mid-step: {exc!r}")
                walk.sockets = [(ws, ids) for ws, ids in walk.sockets if ws.state.name == "OPEN"]
        for ws, _ in walk.sockets:
            ws.close()
        # damaged PDFs over HTTP too: 200 or a 400 naming the file, never a 5xx
        for _ in range(STEPS // 4):
            answer = http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "max_output_tokens": 1,
                    "input": hostile.pdf_input(walk.pdf()),
                },
            )
            code = answer.json().get("error", {}).get("code") if answer.status_code != 200 else ""
            if answer.status_code not in (200, 400) or code not in (
                "",
                "invalid_file",
                "unsupported_input",
            ):
                walk.bad.append(f"a damaged PDF: {answer.status_code} {answer.text[:200]}")
        if not wait_all_finished(server.data_dir, 300):
            walk.bad.append("tasks left unfinished")
        for response_id in walk.stored:
            status = http.get(f"/v1/responses/{response_id}").json().get("status")
            if status not in ("completed", "incomplete"):
                walk.bad.append(f"stored turn {response_id} ended {status}")
    deadline = time.monotonic() + 60
    while store_false_left(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    if store_false_left(server):
        walk.bad.append(f"{store_false_left(server)} store: false responses left on disk")
    walk.bad += check(server.data_dir, Ledger())
    counts = ", ".join(f"{n} {k}" for k, n in walk.counts.items())
    report(
        f"round4 W39 (WebSocket, PDFs): {STEPS} steps, {counts}, {len(walk.bad)} violations,"
        f" {time.monotonic() - started:.0f} s"
    )
    assert not walk.bad, "\n".join(walk.bad[:20])
