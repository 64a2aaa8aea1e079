"""(t) The control plane's own ceiling (issue 40): lmsp with no model cost.

A real ``lmsp serve`` runs the deterministic test engine at full speed
(``LMSP_TEST_ENGINE_DELAY=0``: a step costs nothing), so what is measured is lmsp's own
work — what would bound it in front of a GPU engine decoding thousands of tokens a second:

- **streams**: 64 clients (a process of their own) each create streamed responses
  (``POST /v1/responses``, ``stream: true``: every event committed before it is sent)
  back to back for a window, ``LMSP_PARALLEL=64``; answers of ``LMSP_TEST_ENGINE_LENGTH``
  words (24, the engine's default, and a long one). Generated tokens a second (each
  stream's ``usage.output_tokens`` over the wall time from the first create to the last
  stream's end) and the API process's CPU a token (user + system from ``/proc``; the
  engine process's apart).
- **paced streams**: 32 clients stream 300-token answers of the test engine taking a step
  every 10 ms (100 tokens a second each): a batch of events holds ~10 tokens, so the
  API's CPU a token shows what a batch costs.
- **creates**: 64 clients create durable background responses (``202`` after the
  commit) back to back for a window; the server runs the created tasks meanwhile.
  Creates a second, p50 / p99, errors, the tasks not yet run at the window's end and
  when they all had, the API process's CPU a create (its run included).

Each client is a kept-alive connection that sends the same bytes again
(:class:`bench.clients.KeptAlive`): the clients must not be what is measured.

    .venv/bin/python bench/run.py --only ceiling
    .venv/bin/python bench/ceiling.py [--seconds 10] [--reps 3] [--length 24,1000]

Goals (issue 40): ≥ 20,000 tokens/s; ≥ 1,000 creates/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.clients import (  # noqa: E402
    KeptAlive,
    busy_cpus,
    creates_process,
    machine_ticks,
    median,
    percentile,
    processes,
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tests.helpers import Server, open_db  # noqa: E402

CLIENTS = 64
MODEL = "lmsp-test"
GOAL_TOKENS = 20_000.0
GOAL_CREATES = 1_000.0
#: issue 40's goal for the API's CPU a token (its row is the real model's 8 streams)
GOAL_TOKEN_MS = 0.05
#: the paced row: streams, their answers' length, the engine's step
PACED, PACED_LENGTH, PACED_DELAY = 32, 300, 0.01
Table = Callable[[str, list[str], list[list[str]]], None]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


@dataclass(frozen=True)
class Gauge:
    """What the start or the end of a window finds: the API process's user and system
    CPU, the machine's busy and total ticks, and the writer's time in its transactions
    with its CPU in them (``lmsp_write_commit_seconds_sum``, ``lmsp_write_cpu_seconds``)."""

    at: float
    api: tuple[float, float]
    machine: tuple[int, int]
    writer: tuple[float, float]

    @classmethod
    def take(cls, server: Server, pid: int) -> Gauge:
        with server.client(timeout=30) as http:
            text = http.get("/metrics").text
        found = {"lmsp_write_commit_seconds_sum": 0.0, "lmsp_write_cpu_seconds_total": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in found:
                    found[sample.name] += sample.value
        return cls(
            time.monotonic(),
            cpu_split(pid),
            machine_ticks(),
            (found["lmsp_write_commit_seconds_sum"], found["lmsp_write_cpu_seconds_total"]),
        )

    def since(self, start: Gauge) -> str:
        """What bounded the window from ``start`` to this gauge: how much of it the writer
        (every create's and every task's writes go through its one thread) was in a
        transaction, how much of that on a CPU (the rest waiting, for the disk's sync or
        the interpreter's lock), and how much of the machine stood idle."""
        wall = max(self.at - start.at, 1e-9)
        busy = self.writer[0] - start.writer[0]
        on_cpu = (self.writer[1] - start.writer[1]) / max(busy, 1e-9)
        ticks = self.machine[1] - start.machine[1]
        idle = 1 - (self.machine[0] - start.machine[0]) / max(ticks, 1)
        return (
            f"writer in a transaction {100 * busy / wall:.0f}% of the window, on a CPU "
            f"{100 * on_cpu:.0f}% of that; machine idle {100 * idle:.0f}%"
        )


def engine_pid(server: Server) -> int | None:
    with server.client(timeout=30) as http:
        engines = http.get("/v1/service/activity").json().get("engines") or []
    pids = [e.get("pid") for e in engines if e.get("model") == MODEL]
    return int(pids[0]) if pids and pids[0] else None


def streams_process(
    url: str, headers: dict[str, str], clients: int, start_at: float, seconds: float
) -> tuple[int, int, float, list[str]]:
    """In a child process: ``clients`` clients stream responses back to back, each a new
    one as soon as the last ended, starting none after ``seconds``. The tokens of every
    stream (from its terminal event), the streams, the wall time from the start to the
    last end, and the errors. A stream's bytes are scanned only at its end: the client
    must not be what is measured."""

    async def one(conn: KeptAlive) -> int:
        status, tail = await conn.send()
        if status != 200:
            raise RuntimeError(f"{status}: {tail[:120]!r}")
        at = tail.rfind(b'"output_tokens":')
        if b"response.completed" not in tail or at < 0:
            raise RuntimeError(f"no completed event at the end: {tail[-200:]!r}")
        digits = tail[at + 16 : at + 32].split(b",")[0].split(b"}")[0]
        return int(digits)

    async def main() -> tuple[int, int, float, list[str]]:
        body = {"model": MODEL, "input": "stream hello", "stream": True}
        counts: list[int] = []
        errors: list[str] = []
        conns = [KeptAlive(url, "/v1/responses", headers, body) for _ in range(clients)]
        await asyncio.gather(*(c.open() for c in conns))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.perf_counter()
        stop_at = began + seconds

        async def worker(conn: KeptAlive) -> None:
            while time.perf_counter() < stop_at:
                try:
                    counts.append(await one(conn))
                except (OSError, asyncio.IncompleteReadError, ValueError, RuntimeError) as exc:
                    errors.append(repr(exc)[:160])

        try:
            await asyncio.gather(*(worker(c) for c in conns))
        finally:
            for conn in conns:
                conn.close()
        wall = time.perf_counter() - began
        return sum(counts), len(counts), wall, errors

    return asyncio.run(main())


@dataclass
class Figures:
    rate: float  # tokens or creates a second
    api_ms: float  # API process CPU ms per token or create
    engine_ms: float
    detail: str
    #: of ``api_ms``, the user CPU (the interpreter's work, SQLite's and the parsers')
    user_ms: float = 0.0
    #: what bounded the window (:meth:`Gauge.since`)
    bound: str = ""


def serve(work: Path, length: int, delay: float = 0.0, parallel: int = CLIENTS) -> Server:
    env = {
        "LMSP_TEST_ENGINE_DELAY": str(delay),
        "LMSP_TEST_ENGINE_LENGTH": str(length),
        "LMSP_PARALLEL": str(parallel),
        "LMSP_MAX_QUEUE": "1000000",
    }
    return Server(work, env=env).start()


def _headers(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


def run_streams(
    work: Path,
    pool: ProcessPoolExecutor,
    length: int,
    seconds: float,
    delay: float = 0.0,
    clients: int = CLIENTS,
) -> Figures:
    server = serve(work, length, delay, clients)
    try:
        with server.client() as http:  # the engine loaded, before the window
            http.post("/v1/responses", json={"model": MODEL, "input": "warm"})
        assert server.proc is not None
        api, engine = server.proc.pid, engine_pid(server)
        start_at = time.time() + 1.5
        job = pool.submit(streams_process, server.url, _headers(server), clients, start_at, seconds)
        time.sleep(max(0.0, start_at - time.time()))
        gauge0 = Gauge.take(server, api)
        cpu0 = cpu_seconds(api), cpu_seconds(engine) if engine else 0.0
        tokens, streams, wall, errors = job.result()
        cpu1 = cpu_seconds(api), cpu_seconds(engine) if engine else 0.0
        gauge1 = Gauge.take(server, api)
    finally:
        server.stop()
    per = max(tokens, 1)
    return Figures(
        tokens / wall,
        1000 * (cpu1[0] - cpu0[0]) / per,
        1000 * (cpu1[1] - cpu0[1]) / per,
        f"{streams} streams, {tokens:,} tokens in {wall:.1f} s, {len(errors)} errors"
        + (f" ({errors[0]})" if errors else ""),
        1000 * (gauge1.api[0] - gauge0.api[0]) / max(streams, 1),  # a stream's
        gauge1.since(gauge0),
    )


def run_creates(work: Path, pool: ProcessPoolExecutor, seconds: float) -> Figures:
    server = serve(work, 24)
    try:
        body = {"model": MODEL, "input": "durable hello", "background": True}
        with server.client() as http:
            http.post("/v1/responses", json={"model": MODEL, "input": "warm"})
        assert server.proc is not None
        api = server.proc.pid
        start_at = time.time() + 1.5
        job = pool.submit(
            creates_process, server.url, _headers(server), body, CLIENTS, start_at, seconds
        )
        time.sleep(max(0.0, start_at - time.time()))
        gauge0 = Gauge.take(server, api)
        latencies, errors = job.result()
        window = Gauge.take(server, api).since(gauge0)
        ended = time.monotonic()
        left = _unfinished(server)  # created in the window, not yet run
        drained = _drain(server)
        gauge1 = Gauge.take(server, api)
    finally:
        server.stop()
    n = max(len(latencies), 1)
    return Figures(
        len(latencies) / seconds,
        1000 * (sum(gauge1.api) - sum(gauge0.api)) / n,
        0.0,
        f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, {len(errors)} errors"
        + (f" ({errors[0][:120]})" if errors else "")
        + f"; {left} tasks not yet run at the window's end, all run {drained - ended:.1f} s"
        " after it (the CPU a create counts its run too)",
        1000 * (gauge1.api[0] - gauge0.api[0]) / n,
        window,
    )


def _unfinished(server: Server) -> int:
    with contextlib.closing(open_db(server.data_dir)) as db:
        row = db.execute(
            "SELECT count(*) FROM tasks WHERE status NOT IN ('completed','failed','cancelled')"
        ).fetchone()
    return int(row[0])


def _drain(server: Server, patience: float = 120.0) -> float:
    """When every task created has ended (the monotonic time; at most ``patience``)."""
    deadline = time.monotonic() + patience
    while _unfinished(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    return time.monotonic()


def bench_ceiling(
    work: Path,
    table: Table,
    seconds: float = 10.0,
    reps: int = 3,
    lengths: tuple[int, ...] = (24, 1000),
) -> None:
    other = busy_cpus()
    rows: list[list[str]] = []
    short: list[Figures] = []  # the shortest answers' runs: what bounds them is shown
    with processes(1) as pool:
        for length in lengths:
            runs = [
                run_streams(work / f"streams-{length}-{i}", pool, length, seconds)
                for i in range(reps)
            ]
            short = short or runs
            rate = median([r.rate for r in runs])
            rows.append(
                [
                    f"tokens/s, 64 SSE streams of {length} tokens",
                    f"{rate:,.0f} ({', '.join(f'{r.rate:,.0f}' for r in runs)})",
                    f"{median([r.api_ms for r in runs]):.3f} ms a token "
                    f"(engine {median([r.engine_ms for r in runs]):.3f})",
                    f"≥ {GOAL_TOKENS:,.0f}: {'MET' if rate >= GOAL_TOKENS else 'MISSED'}",
                    runs[len(runs) // 2].detail,
                ]
            )
        rows.append(_paced_row(work, pool, seconds, reps))
        runs = [run_creates(work / f"creates-{i}", pool, seconds) for i in range(reps)]
        rate = median([r.rate for r in runs])
        rows.append(
            [
                "durable creates/s, 64 clients",
                f"{rate:,.0f} ({', '.join(f'{r.rate:,.0f}' for r in runs)})",
                f"{median([r.api_ms for r in runs]):.2f} ms a create",
                f"≥ {GOAL_CREATES:,.0f}: {'MET' if rate >= GOAL_CREATES else 'MISSED'}",
                runs[len(runs) // 2].detail,
            ]
        )
        rows.append(_bound_row(short, runs))
    table(
        f"(t) control-plane ceiling, test engine at full speed, {reps} runs of {seconds:.0f} s, "
        f"medians (other load before: {other:.2f} CPUs)",
        ["measure", "median (runs)", "API process CPU", "goal", "middle run"],
        rows,
    )


def _bound_row(streams: list[Figures], creates: list[Figures]) -> list[str]:
    """What bounds a short request: the API process's user CPU for each (the
    interpreter's work, which one lock lets one thread do at a time: its ceiling if the
    lock were never idle), and what each middle run's window found (:meth:`Gauge.since`)."""
    stream = median([r.user_ms for r in streams]) if streams else 0.0
    create = median([r.user_ms for r in creates])
    runs = (("streams", streams), ("creates", creates))
    seen = [f"{name}: {r[len(r) // 2].bound}" for name, r in runs if r]
    return [
        "what bounds short requests: the API process's one interpreter",
        f"user CPU {stream:.2f} ms a stream, {create:.2f} ms a create and its run",
        f"≤ {1000 / max(stream, 1e-9):,.0f} streams/s, ≤ {1000 / max(create, 1e-9):,.0f}"
        " creates/s with its lock never idle",
        "",
        "; ".join(seen),
    ]


def _paced_row(work: Path, pool: ProcessPoolExecutor, seconds: float, reps: int) -> list[str]:
    """The API's CPU a token when the engine paces the streams: 32 streams of 300 tokens,
    a step every 10 ms (100 tokens a second each), so that a batch of events holds ~10
    tokens — what a batch costs (its wake, write, commit, read and SSE write) shows."""
    runs = [
        run_streams(work / f"paced-{i}", pool, PACED_LENGTH, seconds, PACED_DELAY, PACED)
        for i in range(reps)
    ]
    cpu = median([r.api_ms for r in runs])
    return [
        f"API CPU a token, {PACED} SSE streams, a step every {PACED_DELAY * 1000:.0f} ms",
        f"{median([r.rate for r in runs]):,.0f} tokens/s "
        f"({', '.join(f'{r.api_ms:.3f}' for r in runs)} ms)",
        f"{cpu:.3f} ms a token (engine {median([r.engine_ms for r in runs]):.3f})",
        f"≤ {GOAL_TOKEN_MS} ms: {'MET' if cpu <= GOAL_TOKEN_MS else 'MISSED'}",
        runs[len(runs) // 2].detail,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--length", default="24,1000", help="answer lengths, comma-separated")
    args = parser.parse_args()
    from bench.run import table

    lengths = tuple(int(v) for v in args.length.split(",") if v)
    with tempfile.TemporaryDirectory(prefix="lmsp-ceiling-") as work:
        bench_ceiling(Path(work), table, args.seconds, args.reps, lengths)


if __name__ == "__main__":
    main()
