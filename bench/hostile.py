"""How the service answers while hostile inputs are being read (issue 17).

    .venv/bin/python bench/hostile.py [--rounds 3]

(g) ``/healthz`` latency, polled every 10 ms by one client, first on an idle server,
    then while a schema bomb (8,000 optional properties, just under
    ``LMSP_MAX_SCHEMA_BYTES``, so it is compiled until its CPU budget runs out) and six
    PDF bombs (each inflating to 10 MB of drawing operators, each different) are in
    flight, ``--rounds`` times over; plus the latency of a small request of another
    client sent meanwhile. Goal: ``/healthz`` p99 at most 50 ms. A real ``lmsp serve``
    with its default limits (two input workers); the test engine answers.

Before the fix the bomb alone held ``/healthz`` for 19 s (compiled on the event loop)
and six PDFs stalled another client's request to 42 s (the default executor saturated).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.clients import busy_cpus  # noqa: E402
from tests import hostile  # noqa: E402
from tests.helpers import Server  # noqa: E402

GOAL_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Poller:
    """``/healthz`` every 10 ms in a thread; the latencies in ms."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                began = time.perf_counter()
                status = client.get(f"{self.url}/healthz").status_code
                self.latencies.append((time.perf_counter() - began) * 1000)
                self.failures += status != 200
                self._stop.wait(0.01)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def post(server: Server, body: dict[str, Any], token: str | None = None) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {token or server.token}"}
    began = time.perf_counter()
    with httpx.Client(base_url=server.url, headers=headers, timeout=600) as client:
        status = client.post("/v1/responses", json=body).status_code
    return status, time.perf_counter() - began


def attack(server: Server, round_: int, other: str) -> dict[str, Any]:
    """One schema bomb and six PDF bombs at once, and a small request of another client
    half a second in: each one's status and seconds."""
    results: dict[str, Any] = {"bombs": []}
    schema = {
        "model": "lmsp-test",
        "input": "Fill the form.",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "f",
                "schema": hostile.schema_bomb(8_000 + round_),
            }
        },
    }
    pdfs = [
        {
            "model": "lmsp-test",
            "input": hostile.pdf_input(hostile.text_bomb((10 << 20) + 70 * (round_ * 6 + i))),
        }
        for i in range(6)
    ]

    def send(body: dict[str, Any]) -> None:
        results["bombs"].append(post(server, body))

    threads = [threading.Thread(target=send, args=(body,)) for body in [schema, *pdfs]]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    results["small"] = post(
        server, {"model": "lmsp-test", "input": "Say hi.", "max_output_tokens": 3}, other
    )
    for thread in threads:
        thread.join(600)
    return results


def bench_hostile(rounds: int = 3, table: Any = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="lmsp-bench-hostile-") as work:
        server = Server(Path(work) / "data", env={"LMSP_TEST_ENGINE_DELAY": "0"})
        server.start()
        try:
            with server.client() as http:
                other = http.post(
                    "/v1/clients",
                    json={"name": "bystander", "scopes": ["responses:write", "responses:read"]},
                ).json()["token"]
                http.post("/v1/responses", json={"model": "lmsp-test", "input": "warm up"})
            busy = busy_cpus()
            with Poller(server.url) as idle:
                time.sleep(3)
            rounds_done: list[dict[str, Any]] = []
            with Poller(server.url) as loaded:
                for round_ in range(rounds):
                    rounds_done.append(attack(server, round_, other))
        finally:
            server.stop()
    smalls = [r["small"][1] * 1000 for r in rounds_done]
    statuses = sorted({status for r in rounds_done for status, _ in r["bombs"]})
    bomb_seconds = [seconds for r in rounds_done for _, seconds in r["bombs"]]
    figures = {
        "idle_p50": percentile(idle.latencies, 0.5),
        "idle_p99": percentile(idle.latencies, 0.99),
        "p50": percentile(loaded.latencies, 0.5),
        "p99": percentile(loaded.latencies, 0.99),
        "max": max(loaded.latencies),
    }

    def row(name: str, latencies: list[float]) -> list[str]:
        return [
            name,
            f"{len(latencies)}",
            f"{percentile(latencies, 0.5):.1f}",
            f"{percentile(latencies, 0.99):.1f}",
            f"{max(latencies):.1f}",
        ]

    rows = [row("idle", idle.latencies), row("7 bombs in flight", loaded.latencies)]
    title = (
        f"(g) /healthz while a schema bomb and six PDF bombs are read ({rounds} rounds;"
        f" other load on the machine: {busy:.2f} CPUs)"
    )
    header = ["/healthz", "polls", "p50 ms", "p99 ms", "max ms"]
    if table is not None:
        table(title, header, rows)
    else:
        print(title)
        for row in [header, *rows]:
            print("  ".join(row))
    verdict = "met" if figures["p99"] <= GOAL_MS else "MISSED"
    print(
        f"goal: p99 <= {GOAL_MS:.0f} ms: {verdict}; failed polls {loaded.failures};"
        f" bombs answered {statuses} in {statistics.median(bomb_seconds):.1f} s (median);"
        f" another client's small request: {', '.join(f'{ms:.0f}' for ms in smalls)} ms"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench_hostile(args.rounds)


if __name__ == "__main__":
    main()
