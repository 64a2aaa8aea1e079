"""(r) A turn over a WebSocket against the same turn over SSE (issue 39).

One real ``lmsp serve`` with the bundled model and the same greedy request (the same
prompt, seed and number of output tokens), alternated:

- **streamed**: ``POST /v1/responses`` with ``stream: true`` (a kept-alive HTTP
  connection) against a ``response.create`` on an open socket; the time to the first
  ``response.output_text.delta`` (TTFT) and the output tokens a second from it to the
  terminal event. Goal: the socket's within 5 % of SSE's or better (the same log, only
  the framing differs).
- **a short turn**: a one-token turn on a socket already open (its second turn and
  after) against the same request as a new HTTP request on a new connection (TCP
  connect, head, auth): request to terminal event. Goal: the socket turn faster.

Medians of the runs; the other load on the machine is printed with them (on a busy
machine the figures are not reliable).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench.clients import MODEL, busy_cpus, median, sse_lines
from tests.helpers import Server
from websockets.sync.client import ClientConnection, connect

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
GOAL = 0.05
PAUSE = 0.25
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
DELTA = "response.output_text.delta"


def _body(tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": PROMPT,
        "max_output_tokens": tokens,
        "temperature": 0,
        "seed": 1,
        "store": False,
    }


class Timing:
    """One turn: when it began, its first delta, its end, and its output tokens."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.first: float | None = None
        self.ended = 0.0
        self.tokens = 0

    def see(self, event: dict[str, Any]) -> bool:
        """Note one event; ``True`` at the terminal one."""
        if event["type"] == DELTA and self.first is None:
            self.first = time.perf_counter()
        if event["type"] in TERMINAL:
            self.ended = time.perf_counter()
            self.tokens = int(event["response"]["usage"]["output_tokens"])
            return True
        return False

    @property
    def ttft(self) -> float:
        return (self.first or self.ended) - self.began

    @property
    def rate(self) -> float:
        return self.tokens / max(self.ended - (self.first or self.began), 1e-9)

    @property
    def total(self) -> float:
        return self.ended - self.began


def sse_turn(http: httpx.Client, tokens: int) -> Timing:
    timing = Timing()
    with http.stream("POST", "/v1/responses", json={**_body(tokens), "stream": True}) as answer:
        answer.raise_for_status()
        for _, data in sse_lines(answer):
            if data != "[DONE]" and timing.see(json.loads(data)):
                break
    return timing


def ws_turn(ws: ClientConnection, tokens: int) -> Timing:
    timing = Timing()
    ws.send(json.dumps({"type": "response.create", **_body(tokens)}))
    while not timing.see(json.loads(ws.recv(timeout=600))):
        pass
    return timing


def new_http_turn(server: Server, tokens: int) -> Timing:
    with server.client(timeout=600) as http:  # a new connection: connect, head, auth
        return sse_turn(http, tokens)


def _alternate(reps: int, runs: dict[str, Callable[[], Timing]]) -> dict[str, list[Timing]]:
    seen: dict[str, list[Timing]] = {name: [] for name in runs}
    for _ in range(reps):  # alternated, so drift and noise hit both alike
        for name, run in runs.items():
            seen[name].append(run())
            time.sleep(PAUSE)
    return seen


def bench_websocket(
    work: Path,
    tokens: int,
    reps: int,
    table: Callable[[str, list[str], list[list[str]]], None],
) -> list[list[str]]:
    busy = busy_cpus()
    server = Server(work / "websocket-data").start()
    url = server.url.replace("http://", "ws://") + "/v1/responses"
    headers = {"Authorization": f"Bearer {server.token}"}
    rows: list[list[str]] = []
    try:
        with server.client(timeout=600) as http, connect(url, additional_headers=headers) as ws:
            sse_turn(http, 8)  # warm-up: the model loads on first use
            ws_turn(ws, 8)
            long = _alternate(
                reps, {"SSE": lambda: sse_turn(http, tokens), "WS": lambda: ws_turn(ws, tokens)}
            )
            short = _alternate(
                reps,
                {"new HTTP": lambda: new_http_turn(server, 1), "socket": lambda: ws_turn(ws, 1)},
            )
    finally:
        server.stop()
    after = busy_cpus()
    ttft = {name: median([t.ttft for t in runs]) for name, runs in long.items()}
    rate = {name: median([t.rate for t in runs]) for name, runs in long.items()}
    for name in long:
        rows.append(
            [f"{name}, {tokens} tokens", f"{ttft[name] * 1000:.0f}", f"{rate[name]:.1f}", ""]
        )
    ttft_ratio, rate_ratio = ttft["WS"] / ttft["SSE"], rate["WS"] / rate["SSE"]
    met = ttft_ratio <= 1 + GOAL and rate_ratio >= 1 - GOAL  # the socket no worse
    rows.append(
        [
            "ratio WS / SSE",
            f"{ttft_ratio:.3f}",
            f"{rate_ratio:.3f}",
            "MET" if met else "MISSED",
        ]
    )
    total = {name: median([t.total for t in runs]) for name, runs in short.items()}
    for name in short:
        rows.append([f"1-token turn, {name}", f"{total[name] * 1000:.1f}", "", ""])
    faster = total["socket"] < total["new HTTP"]
    rows.append(
        [
            "socket / new HTTP",
            f"{total['socket'] / total['new HTTP']:.3f}",
            "",
            "MET" if faster else "MISSED",
        ]
    )
    table(
        f"(r) WebSocket vs SSE: {MODEL}, greedy, the same request, median of {reps}"
        f" alternated runs (goals: TTFT and tok/s within {GOAL:.0%} of SSE's or better; a"
        " turn on an open socket faster than a new HTTP request)",
        ["turn", "TTFT or total ms", "tok/s", "goal"],
        rows,
    )
    print(f"other load on the machine: {busy:.2f} CPUs before, {after:.2f} after")
    if max(busy, after) > 0.25:
        print("*** the machine was busy with other work: these figures are not reliable")
    return rows
