"""(n) fair share (issue 28): what limits and the usage ledger cost, and how long a light
client waits behind a heavy one.

Overhead: the same app in this process (ASGI, no sockets), a non-owner client with all
four limits set (high enough never to refuse) and the ledger written as every task
ends ("on"), against the same client with the limit check and the ledger write switched
off in the store ("off"); runs alternate on/off and the medians are compared:
 - creates/s: ``concurrency`` clients create background responses (test engine,
   running them to their end meanwhile, so the ledger is written too);
 - 8-stream throughput: 8 streamed real-model responses at once (``LMSP_PARALLEL=8``),
   output tokens per second of wall time.
Goal: on ≥ 0.97 x off.

Light behind heavy: a real ``lmsp serve`` (real model, 2 sequences, and the reserved
one of the default ``LMSP_RESERVED_SEQUENCES=1``; then without it); a heavy client
keeps 100 tasks queued, a light client sends one request at a time (streamed, so its
wait to start and its own run are timed apart); its latency against twice one task's
alone, and each request against one task's duration under the same load plus its own
(the tasks are the same request: a heavy task runs as long as the light one's own run,
so a request is within the goal when it waited no longer than its own run took).
Goal: p99 ≤ one task's duration plus its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from bench.clients import sse_lines
from tests.helpers import Server

MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"
HIGH = {
    "max_queued": 10**9,
    "max_running": 10**6,
    "tokens_per_minute": 10**12,
    "tokens_per_day": 10**12,
}
Table = Callable[[str, list[str], list[list[str]]], None]


@contextlib.contextmanager
def switched_off(off: bool) -> Iterator[None]:
    """The limit check and the ledger write made no-ops in the store (``off``)."""
    from lmsp.store import responses, tasks

    check, record = responses.limits.check, tasks.usage.record_finished
    if off:
        responses.limits.check = lambda conn, client_id: None  # type: ignore[assignment]
        tasks.usage.record_finished = lambda conn, task: None  # type: ignore[assignment]
    try:
        yield
    finally:
        responses.limits.check = check  # type: ignore[assignment]
        tasks.usage.record_finished = record  # type: ignore[assignment]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _creates(http: httpx.AsyncClient, concurrency: int, seconds: float) -> float:
    body = {"model": TEST_MODEL, "input": "fair hello", "background": True}
    done = 0

    async def worker(stop_at: float) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            answer = await http.post("/v1/responses", json=body)
            if answer.status_code != 202:
                raise RuntimeError(f"{answer.status_code}: {answer.text}")
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


async def _streams(http: httpx.AsyncClient, streams: int, tokens: int) -> float:
    body = {
        "model": MODEL,
        "input": "Write a long story about a lighthouse keeper.",
        "max_output_tokens": tokens,
        "temperature": 0,
    }

    async def one(i: int) -> int:
        answer = await http.post("/v1/responses", json={**body, "seed": i})
        answer.raise_for_status()
        return int(answer.json()["usage"]["output_tokens"])

    start = time.perf_counter()
    made = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(made) / (time.perf_counter() - start)


def overhead(
    work: Path, concurrency: int, seconds: float, reps: int, tokens: int
) -> list[list[str]]:
    os.environ["LMSP_TEST_ENGINE_DELAY"] = "0"
    from lmsp.api.app import create_app
    from lmsp.config import Settings

    settings = Settings(
        data_dir=work / "fair-data",
        enable_test_engine=True,
        in_thread_engines=frozenset({"test"}),
        max_queue=10**6,
        gc_interval=3600,
        parallel=8,
        allowed_hosts=("lmsp",),
    )
    app = create_app(settings)

    async def main() -> dict[str, dict[str, list[float]]]:
        found: dict[str, dict[str, list[float]]] = {
            "creates": {"on": [], "off": []},
            "streams": {"on": [], "off": []},
        }
        async with app.router.lifespan_context(app):
            owner = settings.owner_token_path.read_text().strip()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport,
                base_url="http://lmsp",
                timeout=600,
                headers={"Authorization": f"Bearer {owner}"},
            ) as admin:
                made = await admin.post(
                    "/v1/clients", json={"name": "bench", "scopes": ["responses:write"]}
                )
                assert made.status_code == 201, made.text
                client_id, token = made.json()["id"], made.json()["token"]
                await admin.patch(f"/v1/clients/{client_id}", json={"limits": HIGH})
            async with httpx.AsyncClient(
                transport=transport,
                base_url="http://lmsp",
                timeout=600,
                headers={"Authorization": f"Bearer {token}"},
            ) as http:
                # streams first: the creates leave a backlog the streams would wait behind
                await _streams(http, 2, 8)  # the real model loaded
                for _ in range(reps):
                    for side in ("off", "on"):
                        with switched_off(side == "off"):
                            rate = await _streams(http, 8, tokens)
                        found["streams"][side].append(rate)
                await _creates(http, concurrency, 1.0)  # warm-up
                for _ in range(reps):
                    for side in ("on", "off"):
                        with switched_off(side == "off"):
                            rate = await _creates(http, concurrency, seconds)
                        found["creates"][side].append(rate)
        return found

    found = asyncio.run(main())
    rows = []
    for name, unit in (("creates", "creates/s"), ("streams", "tokens/s (8 streams)")):
        on = statistics.median(found[name]["on"])
        off = statistics.median(found[name]["off"])
        rows.append([unit, f"{on:.1f}", f"{off:.1f}", f"{on / off:.3f}"])
    return rows


def light_behind_heavy(
    work: Path, samples: int, backlog: int, tokens: int, reserved: int = 1
) -> list[list[str]]:
    env = {"LMSP_PARALLEL": "2", "LMSP_RESERVED_SEQUENCES": str(reserved)}
    server = Server(work / f"fair-wait-{reserved}", env=env).start()
    stop = threading.Event()
    try:
        with server.client(timeout=600) as owner:
            made = [
                owner.post(
                    "/v1/clients", json={"name": n, "scopes": ["responses:read", "responses:write"]}
                ).json()
                for n in ("heavy", "light")
            ]
        heavy, light = (
            httpx.Client(
                base_url=server.url, timeout=600, headers={"Authorization": f"Bearer {m['token']}"}
            )
            for m in made
        )
        body: dict[str, Any] = {
            "model": MODEL,
            "input": "Count from one to one hundred in words.",
            "max_output_tokens": tokens,
            "temperature": 0,
        }

        def timed() -> tuple[float, float]:
            """One light request, streamed: (its wait to start, the whole request)."""
            t0 = time.perf_counter()
            started = None
            with light.stream("POST", "/v1/responses", json={**body, "stream": True}) as answer:
                answer.raise_for_status()
                for event, _ in sse_lines(answer):
                    if event == "response.in_progress" and started is None:
                        started = time.perf_counter() - t0
            whole = time.perf_counter() - t0
            return (whole if started is None else started), whole

        alone = [timed()[1] for _ in range(3)]
        one_task = statistics.median(alone)

        def keep_queued() -> None:
            """Top the heavy client's queue up to ``backlog`` tasks, all the while."""
            mine: list[str] = []
            while not stop.is_set():
                if len(mine) >= backlog:
                    listed = heavy.get("/v1/tasks", params={"status": "queued", "limit": 100})
                    queued = (
                        {t["id"] for t in listed.json()["data"]} if listed.is_success else set()
                    )
                    mine = [t for t in mine if t in queued]
                while len(mine) < backlog and not stop.is_set():
                    answer = heavy.post("/v1/responses", json={**body, "background": True})
                    if answer.status_code == 202:
                        mine.append(answer.json()["task"]["id"])
                stop.wait(0.2)

        filler = threading.Thread(target=keep_queued, daemon=True)
        filler.start()
        time.sleep(5)  # the backlog is in place
        runs = [timed() for _ in range(samples)]
        waits = [whole for _, whole in runs]
        # heavy and light tasks are the same request: a task's own run, under the same
        # load, is what one heavy task it waited for takes too
        own = [whole - start for start, whole in runs]
        within = sum(whole <= 2 * (whole - start) for start, whole in runs)
        stop.set()
        filler.join(30)
        heavy.close()
        light.close()
    finally:
        stop.set()
        server.stop()
    return [
        [
            f"{backlog} heavy tasks queued, {reserved} reserved sequence(s)",
            f"{one_task:.2f}",
            f"{statistics.median(waits):.2f}",
            f"{percentile(waits, 0.99):.2f}",
            f"{2 * one_task:.2f}",
            f"{statistics.median(own):.2f}",
            f"{percentile([start for start, _ in runs], 0.99):.2f}",
            f"{within}/{len(runs)}",
        ]
    ]


def bench_fairshare(work: Path, seconds: float, table: Table, quick: bool = False) -> None:
    reps = 1 if quick else 3
    rows = overhead(work, 16, seconds, reps, 16 if quick else 48)
    table(
        "(n) fair share: limits + usage ledger on vs off (in process, medians)",
        ["figure", "on", "off", "on/off"],
        rows,
    )
    rows = [
        row
        for reserved in (1, 0)  # the default, and without the reserve
        for row in light_behind_heavy(work, 4 if quick else 24, 100, 16, reserved)
    ]
    table(
        "(n) fair share: a light client's request while a heavy one keeps 100 queued (s)",
        [
            "case",
            "one task alone",
            "p50",
            "p99",
            "2 x alone",
            "own run under load (p50)",
            "wait to start (p99)",
            "≤ a task + its own",
        ],
        rows,
    )
