"""(k) webhooks (issue 25): delivery latency and the cost of the outbox on creates.

Latency: one real ``lmsp serve`` with ``LMSP_PARALLEL=8``; 8 clients stream responses
back to back for ``seconds``, and a webhook hears each end: with the bundled model (8
tokens a response: few events on a small machine) and with the test engine at 0.01 s a
token (64 tokens: many events through the same durable path). The
receiver (a process of its own, a bare asyncio HTTP server answering ``200`` at once)
notes when it sent each ``2xx``; the latency of an event is that time minus the outbox
row's ``created_at`` (written inside the transaction that ends the task, just before its
commit). Reported: p50 and p99 over every event of the run.

Beside dead receivers (issue 36): one client's 32 webhooks point at a receiver that
accepts every connection and never answers, and it ends 8 responses (256 deliveries,
each try held 10 s), then one more every half second; meanwhile another client ends a
response every 0.3 s and its webhook's latency is measured (the same way). Bound: 2 s.

Creates: ``clients`` concurrent HTTP clients create background responses (each ``202``
after its commit) for ``seconds`` against a fresh ``lmsp serve`` (test engine, no
delay: tasks end as fast as they are created, each end a delivery), with no webhook
and with one registered (whose deliveries go out meanwhile), alternated twice. Goal:
with ≥ 0.95 x without. The machine's other load is printed: on a busy machine the figures are
not reliable.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench.clients import MODEL, busy_cpus, sse_lines
from tests.helpers import Server, free_port
from tests.webhook_receiver import Dead

GOAL = 0.95
STREAMS = 8
PAIRS = 2  # runs without and with a webhook, alternated

RECEIVER = r"""
import asyncio, sys, time
out = open(sys.argv[2], "a", buffering=1)
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length, hook = 0, ""
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"webhook-id":
                    hook = value.strip().decode()
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            out.write(f"{hook} {time.time():.6f}\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


class Receiver:
    """The receiver process; :meth:`times` reads webhook id → when its 2xx was sent."""

    def __init__(self, work: Path, name: str) -> None:
        self.port = free_port()
        self.log = work / f"{name}-receiver.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, str(self.port), str(self.log)]
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.post(self.url, content=b"", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the receiver did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def times(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for line in self.log.read_text().splitlines():
            hook, _, stamp = line.partition(" ")
            if hook:
                found.setdefault(hook, float(stamp))
        return found

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _deliveries(http: httpx.Client, hook_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 100}
        if after:
            params["after"] = after
        page = http.get(f"/v1/webhooks/{hook_id}/deliveries", params=params).json()
        rows += page["data"]
        if not page["has_more"]:
            return rows
        after = page["last_id"]


def _settled(http: httpx.Client, hook_id: str, timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = _deliveries(http, hook_id)
        if all(r["status"] != "pending" for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def latency(
    work: Path, seconds: float, model: str, tokens: int, delay: str = "0.002"
) -> tuple[list[float], int]:
    """(latencies in seconds, responses completed) with 8 streams generating."""
    receiver = Receiver(work, f"latency-{model}")
    env = {"LMSP_PARALLEL": str(STREAMS), "LMSP_TEST_ENGINE_DELAY": delay}
    server = Server(work / f"hook-latency-{model}", env=env).start()
    try:
        with server.client(timeout=300) as http:
            every = ["response.completed", "response.incomplete"]
            hook = http.post("/v1/webhooks", json={"url": receiver.url, "events": every}).json()
            body = {"model": model, "input": "Tell me about lighthouses.", "stream": True}
            body["max_output_tokens"] = tokens
            warm = {**body, "stream": False}
            http.post("/v1/responses", json=warm).raise_for_status()  # the model loaded
            stop_at = time.monotonic() + seconds
            done = [0]

            def stream() -> None:
                with server.client(timeout=300) as mine:
                    while time.monotonic() < stop_at:
                        with mine.stream("POST", "/v1/responses", json=body) as answer:
                            for _ in sse_lines(answer):
                                pass
                        done[0] += 1

            threads = [threading.Thread(target=stream) for _ in range(STREAMS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rows = _settled(http, hook["id"])
        got = receiver.times()
        lat = [got[r["id"]] - r["created_at"] for r in rows if r["id"] in got]
        return lat, done[0] + 1
    finally:
        server.stop()
        receiver.stop()


async def _hammer(url: str, token: str, clients: int, seconds: float) -> int:
    body = {"model": "lmsp-test", "input": "durable hello", "background": True}
    limits = httpx.Limits(max_connections=clients)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:
        for _ in range(clients):
            await http.post("/v1/responses", json=body)
        count = 0
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() < stop_at:
                try:
                    answer = await http.post("/v1/responses", json=body)
                except httpx.TransportError:  # a kept-alive connection the server closed
                    continue
                if answer.status_code != 202:
                    raise RuntimeError(f"{answer.status_code}: {answer.text}")
                count += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
        return count


def creates(work: Path, name: str, clients: int, seconds: float, hook: bool) -> tuple[float, int]:
    """(creates per second, deliveries delivered by the end of the run)."""
    env = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_MAX_QUEUE": "1000000"}
    receiver = Receiver(work, name) if hook else None
    server = Server(work / name, env=env).start()
    try:
        if receiver is not None:
            with server.client() as http:
                hook = {"url": receiver.url, "events": ["response.completed"]}
                http.post("/v1/webhooks", json=hook).raise_for_status()
        began = time.perf_counter()
        count = asyncio.run(_hammer(server.url, server.token, clients, seconds))
        rate = count / (time.perf_counter() - began)
        return rate, len(receiver.times()) if receiver is not None else 0
    finally:
        server.stop()
        if receiver is not None:
            receiver.stop()


def _client(server: Server, name: str) -> httpx.Client:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients", json={"name": name, "scopes": ["responses:read", "responses:write"]}
        )
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=120)


def beside_dead(work: Path, count: int) -> list[float]:
    """Another client's delivery latencies (``count``) while one client's 32 webhooks
    point at a receiver that never answers."""
    dead, receiver = Dead().start(), Receiver(work, "beside-dead")
    server = Server(work / "beside-dead").start()
    stop = threading.Event()
    try:
        with _client(server, "hostile") as hostile, _client(server, "bystander") as other:
            for n in range(32):
                body = {"url": f"{dead.url}?{n}", "events": ["response.completed"]}
                hostile.post("/v1/webhooks", json=body).raise_for_status()
            done = {"model": "lmsp-test", "input": "x"}

            def keep_ending() -> None:
                for _ in range(8):
                    hostile.post("/v1/responses", json=done).raise_for_status()
                while not stop.wait(0.5):
                    hostile.post("/v1/responses", json=done).raise_for_status()

            worker = threading.Thread(target=keep_ending, daemon=True)
            worker.start()
            while dead.accepted < 16:  # the hostile client's share is in flight
                time.sleep(0.02)
            body = {"url": receiver.url, "events": ["response.completed"]}
            hook = other.post("/v1/webhooks", json=body).json()
            for _ in range(count):
                other.post("/v1/responses", json=done).raise_for_status()
                time.sleep(0.3)
            stop.set()
            worker.join(60)
            time.sleep(1)
            rows = _deliveries(other, hook["id"])
        got = receiver.times()
        return [got[r["id"]] - r["created_at"] for r in rows if r["id"] in got]
    finally:
        stop.set()
        server.stop()
        receiver.stop()
        dead.stop()


Table = Callable[[str, list[str], list[list[str]]], None]


def bench_webhooks(work: Path, clients: int, seconds: float, table: Table) -> list[list[str]]:
    load = busy_cpus()
    runs = {
        MODEL: latency(work, seconds, MODEL, 8),
        # the test engine at 100 tokens/s a stream: many more events, same durable path
        "lmsp-test, 0.01 s a token": latency(work, seconds, "lmsp-test", 64, "0.01"),
    }
    beside = beside_dead(work, 20)
    plain: list[float] = []
    hooked: list[float] = []
    heard = 0
    for i in range(PAIRS):  # alternated, so a change in the machine's load hits both
        plain.append(creates(work, f"creates-plain-{i}", clients, seconds, hook=False)[0])
        rate, delivered = creates(work, f"creates-hook-{i}", clients, seconds, hook=True)
        hooked.append(rate)
        heard += delivered
    without, with_hook = sum(plain) / PAIRS, sum(hooked) / PAIRS
    rows = [
        [
            f"delivery latency, {STREAMS} streams generating ({name})",
            f"{len(lat)} events of {completed} responses",
            f"p50 {_percentile(lat, 0.5) * 1000:.1f} ms",
            f"p99 {_percentile(lat, 0.99) * 1000:.1f} ms",
        ]
        for name, (lat, completed) in runs.items()
    ]
    rows += [
        [
            "another client's delivery, one client's 32 receivers dead (bound 2 s)",
            f"{len(beside)} events",
            f"p50 {_percentile(beside, 0.5) * 1000:.1f} ms",
            f"max {max(beside, default=float('nan')) * 1000:.1f} ms",
        ],
        [
            f"creates/s, {clients} clients, no webhook (mean of {PAIRS})",
            f"{without:.0f}/s ({', '.join(f'{r:.0f}' for r in plain)})",
            "",
            "",
        ],
        [
            f"creates/s, {clients} clients, one webhook (mean of {PAIRS})",
            f"{with_hook:.0f}/s ({', '.join(f'{r:.0f}' for r in hooked)}; {heard} delivered)",
            f"{with_hook / without:.2f} x (goal {GOAL})",
            "",
        ],
    ]
    table(
        f"(k) webhooks: {seconds:.0f} s each; other load on the machine {load:.1f} CPUs",
        ["run", "figure", "", ""],
        rows,
    )
    return rows
