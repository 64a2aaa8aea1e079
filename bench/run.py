"""lmsp benchmarks, side by side with their bare baselines, in one run.

    .venv/bin/python bench/run.py        (or: make bench)

(a) generation: tokens/s for one greedy prompt through bare llama-cpp-python (the same
    GGUF file, n_ctx and thread count, the same prompt tokens) and through a real
    ``lmsp serve`` subprocess (streamed over HTTP, every event persisted); runs are
    interleaved and the median of each is reported.
(b) durable writes: background responses created per second by concurrent HTTP clients
    (each answered ``202`` only after its commit) against a naive durable baseline, raw
    SQLite doing one INSERT + COMMIT per row (WAL, synchronous=FULL); plus an in-process
    run of the same app that reads the writer's commit counter.
(c, d) constrained decoding (bench/constraints.py): tokens/s held to a JSON Schema ÷
    unconstrained, same prompt and seed; the compile time of a 20-property schema.
(e) snapshot writes (bench/snapshots.py): the bytes one 2,000-token task's snapshots
    cost, flushed every 8 tokens, the old whole-list JSON against today's chunks.
(g) hostile inputs (bench/hostile.py): /healthz p99 while a schema bomb and six PDF
    bombs are in flight (goal: 50 ms), and another client's small request meanwhile.
(h) embeddings (bench/embeddings.py): inputs/s through POST /v1/embeddings against
    llama-server's on the same GGUF (goal: at least 0.9x the faster llama-server).
(i) the Messages API against Chat Completions on the same prompt (bench/dialects.py):
    the overhead of Anthropic's shapes over the same durable core.
(j) scale-out (bench/scaleout.py): durable creates with 64 clients, PostgreSQL against
    SQLite, one node and three; the recovery of a killed node's task against the lease TTL.
(n) fair share (bench/fairshare.py): creates/s and 8-stream throughput with limits and the
    usage ledger on vs off; a light client's wait while a heavy one keeps 100 queued.
(l) model pulls (bench/pull.py): ``POST /v1/models/pull`` from a loopback stand-in hub
    against ``curl`` of the same file (goal: ≥ 0.9x, hashing included), and the CPU a
    pull takes while 8 streams generate.
(k) webhooks (bench/webhooks.py): delivery latency from the terminal commit to the
    receiver's 2xx with 8 streams generating, and beside one client's 32 dead receivers;
    creates/s with and without a webhook.
(o) shared work under a hostile client (bench/sharedwork.py): another client's 16-token
    response while one client sends 64x512-token embeddings and 16 multi-file requests,
    against its latency alone (goal: at most 2x).
(m) MCP tools (bench/mcptools.py): the overhead of an MCP call on loopback against the tool's
    own time; a 5-call loop run on the server against the same loop driven by the client
    over function tools (goal: <= 1.0x).
(p) a long conversation (bench/conversations.py): /healthz p99 while another client's
    turns run on a conversation filled to its quota (goal: 100 ms), each turn's time.
(s) a remote model (bench/remote.py): lmsp in front of llama-server against llama-server
    used directly: 8-stream throughput (goal: >= 0.97x), time to first text (goal: +5 ms at
    most), the upstream's slot free after a cancel (goal: 100 ms); with every process on
    every core, and with the upstream on a core of its own (a GPU host's stand-in).
(r) WebSocket mode (bench/websocket.py): a turn over a socket against the same turn over
    SSE (TTFT and tokens/s, goal: within 5 %); a short turn on an open socket against a
    new HTTP request (goal: faster).
(t) the control plane's ceiling (bench/ceiling.py, issue 40): the test engine at full
    speed; tokens/s streamed durably to 64 SSE clients and the API's CPU a token (goal:
    20,000 tokens/s), durable creates/s from 64 clients (goal: 1,000/s).
(q) a deep queue (bench/backlog.py, issue 40): a claim and a create's write behind 100,
    1,000 and 10,000 queued tasks (in process, the store alone).
(u) resume after a crash (bench/reattach.py): to the next token after ``kill -9`` of the API
    process ~1,000 tokens in, with the engine exiting with it and reattached
    (``LMSP_ENGINE_ORPHAN_TIMEOUT``), and after ``kill -9`` of the engine process.
(v) the API process's own start (bench/start.py): ``lmsp serve`` launched to ``/healthz``
    200 on a data directory with a running task to recover, wall and CPU seconds, where
    the time went by its log, and the top import costs.
(f) lmsp against llama.cpp's ``llama-server`` (built from the installed llama-cpp-python's
    source distribution into a cache the first time): the benchmarks of issues 10 and 16,
    see ``bench/compare.py``.

``LMSP_BENCH_QUICK=1`` makes every part small: a smoke run of the harness, not figures.

Nothing here is part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import compare  # noqa: E402
from bench.clients import sse_lines  # noqa: E402
from tests.helpers import Server  # noqa: E402  (the test suite's subprocess launcher)

MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
PAUSE = 0.25  # seconds between runs, so one side's idle threads settle
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


def threads() -> int:
    """The thread count lmsp's llama.cpp engine uses (``LMSP_THREADS`` or all CPUs)."""
    return max(1, int(os.environ.get("LMSP_THREADS", "0")) or (os.cpu_count() or 1))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    print(f"\n{title}")
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


@dataclass
class Run:
    tokens: int
    seconds: float
    first_token: float  # seconds from the request to the first text
    prompt_tokens: int
    text: str

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_rate(self) -> float:
        """Tokens after the first, over the time after the first."""
        span = self.seconds - self.first_token
        return (self.tokens - 1) / span if span > 0 else float("nan")


# -- (a) generation ----------------------------------------------------------------------


@contextlib.contextmanager
def no_extra_buffer_types() -> Iterator[None]:
    """Models loaded by ``Llama`` meanwhile get ``use_extra_bufts = False``, as lmsp's
    (``engines/llama_context.py``): the same CPU kernels on both sides, and no AMX
    repacking, whose matmul crashes on some CPUs. ``Llama`` takes no such argument; it
    reads llama.cpp's default model parameters, so those are amended for the while."""
    import importlib

    low: Any = importlib.import_module("llama_cpp.llama_cpp")  # what llama.py calls
    default = low.llama_model_default_params

    def amended() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = amended
    try:
        yield
    finally:
        low.llama_model_default_params = default


class Bare:
    """llama-cpp-python by itself, prompted with the tokens lmsp would build."""

    def __init__(self, model_path: Path, n_ctx: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        with no_extra_buffer_types():
            self.llm = Llama(
                model_path=str(model_path),
                n_ctx=n_ctx,
                n_threads=threads(),
                n_threads_batch=threads(),
                flash_attn=True,  # as lmsp's context
                verbose=False,
            )
        meta = dict(self.llm.metadata)

        def piece(token: int) -> str:
            return bytes(self.llm.detokenize([token], special=True)).decode(errors="replace")

        formatter = Jinja2ChatFormatter(
            template=meta["tokenizer.chat_template"],
            eos_token=piece(self.llm.token_eos()),
            bos_token=piece(self.llm.token_bos()),
        )
        text = formatter(messages=[{"role": "user", "content": PROMPT}]).prompt
        self.prompt = self.llm.tokenize(text.encode(), add_bos=False, special=True)

    def run(self, max_tokens: int) -> Run:
        self.llm.reset()  # type: ignore[no-untyped-call]  # evaluate the prompt every time, as lmsp does for each task
        start = time.perf_counter()
        first = None
        chunks: Any = self.llm.create_completion(
            prompt=self.prompt, max_tokens=max_tokens, temperature=0.0, stream=True
        )
        count = 0
        text = ""
        for chunk in chunks:
            if first is None:
                first = time.perf_counter() - start
            choice = chunk["choices"][0]
            text += choice["text"]
            # one chunk a token; a last, empty one carries the finish_reason
            count += choice["finish_reason"] is None
        seconds = time.perf_counter() - start
        return Run(count, seconds, first or seconds, len(self.prompt), text)

    def close(self) -> None:
        self.llm.close()


def lmsp_run(http: httpx.Client, max_tokens: int) -> Run:
    body = {
        "model": MODEL,
        "input": PROMPT,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    final: dict[str, Any] | None = None
    with http.stream("POST", "/v1/responses", json=body) as answer:
        answer.raise_for_status()
        for event, data in sse_lines(answer):  # a data line without an event: not ours
            if event == "response.output_text.delta" and first is None:
                first = time.perf_counter() - start
            if event in TERMINAL:
                final = json.loads(data)["response"]
    seconds = time.perf_counter() - start
    assert final is not None and final["usage"], "no terminal event"
    usage = final["usage"]
    text = "".join(part["text"] for item in final["output"] for part in item["content"])
    return Run(usage["output_tokens"], seconds, first or seconds, usage["input_tokens"], text)


def bench_generation(work: Path, max_tokens: int, reps: int) -> list[list[str]]:
    from lmsp.bootstrap import bundled_model_path
    from lmsp.config import Settings

    n_ctx = Settings().n_ctx
    bare = Bare(bundled_model_path(), n_ctx)
    server = Server(work / "gen-data", env={"LMSP_THREADS": str(threads())}).start()
    try:
        with server.client(timeout=300) as http:
            bare.run(8)  # warm-up: caches, and lmsp loads its model on first use
            lmsp_run(http, 8)
            bare_runs: list[Run] = []
            lmsp_runs: list[Run] = []
            for _ in range(reps):  # interleaved, so drift and noise hit both alike
                bare_runs.append(bare.run(max_tokens))
                time.sleep(PAUSE)
                lmsp_runs.append(lmsp_run(http, max_tokens))
                time.sleep(PAUSE)
    finally:
        server.stop()
        bare.close()

    def row(name: str, runs: list[Run]) -> list[str]:
        rates = [r.rate for r in runs]
        return [
            name,
            f"{median([r.prompt_tokens for r in runs]):.0f}",
            f"{median([r.tokens for r in runs]):.0f}",
            f"{median(rates):.1f}",
            f"{max(rates):.1f}",
            f"{median([r.decode_rate for r in runs]):.1f}",
            f"{median([r.first_token for r in runs]) * 1000:.0f}",
        ]

    def ratio(key: Callable[[Run], float]) -> str:
        return f"{median([key(r) for r in lmsp_runs]) / median([key(r) for r in bare_runs]):.3f}"

    rows = [
        row("bare llama-cpp-python", bare_runs),
        row("lmsp (HTTP stream, persisted)", lmsp_runs),
        [
            "ratio lmsp / bare",
            "",
            "",
            ratio(lambda r: r.rate),
            f"{max(r.rate for r in lmsp_runs) / max(r.rate for r in bare_runs):.3f}",
            ratio(lambda r: r.decode_rate),
            ratio(lambda r: r.first_token),
        ],
    ]
    table(
        f"(a) generation: {MODEL}, greedy, {max_tokens} tokens max, n_ctx {n_ctx}, "
        f"{threads()} threads, median of {reps} interleaved runs",
        ["path", "prompt tok", "out tok", "tok/s", "best tok/s", "decode tok/s", "first text ms"],
        rows,
    )
    same = bare_runs[0].text == lmsp_runs[0].text
    print(f"same greedy text from both: {'yes' if same else 'no'}")
    print(
        "tok/s = output tokens / (request to last token), median; best = fastest run;"
        " decode = after the first text;"
        " lmsp's first text includes HTTP, the create commit, the loading/running"
        " commits and its 50 ms delta batching"
    )
    return rows


# -- (b) durable writes ------------------------------------------------------------------


@dataclass
class Load:
    requests: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


async def hammer(
    make_client: Callable[[], httpx.AsyncClient],
    concurrency: int,
    duration: float,
    at_start: Callable[[], None] | None = None,
) -> Load:
    """``concurrency`` clients create background responses for ``duration`` seconds;
    ``at_start`` runs after the warm-up, right before the measured window."""
    body = {"model": TEST_MODEL, "input": "durable hello", "background": True}
    latencies: list[float] = []

    async def worker(client: httpx.AsyncClient, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            answer = await client.post("/v1/responses", json=body)
            if answer.status_code != 202:
                raise RuntimeError(f"{answer.status_code}: {answer.text}")
            latencies.append(time.perf_counter() - t0)

    async with make_client() as client:
        for _ in range(concurrency):  # warm-up: connections and code paths
            await client.post("/v1/responses", json=body)
        if at_start is not None:
            at_start()
        start = time.perf_counter()
        await asyncio.gather(*(worker(client, start + duration) for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    return Load(len(latencies), seconds, latencies)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def lmsp_writes(work: Path, concurrency: int, duration: float) -> Load:
    env = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_MAX_QUEUE": "1000000"}
    server = Server(work / "write-data", env=env).start()
    try:
        token = server.token

        def make() -> httpx.AsyncClient:
            limits = httpx.Limits(max_connections=concurrency)
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.AsyncClient(
                base_url=server.url, headers=headers, limits=limits, timeout=60
            )

        return asyncio.run(hammer(make, concurrency, duration))
    finally:
        server.stop()


def lmsp_in_process(work: Path, concurrency: int, duration: float) -> tuple[Load, int, int]:
    """The same app in this process (ASGI, no sockets), runner paused: every commit
    of the writer is a create's, so commits vs requests is exact."""
    os.environ["LMSP_TEST_ENGINE_DELAY"] = "0"
    from lmsp.api.app import create_app
    from lmsp.config import Settings

    settings = Settings(
        data_dir=work / "asgi-data", enable_test_engine=True, max_queue=10**6, gc_interval=3600
    )
    app = create_app(settings)

    async def main() -> tuple[Load, int, int]:
        async with app.router.lifespan_context(app):
            svc = app.state.lmsp
            await asyncio.to_thread(svc.runner.stop)
            token = settings.owner_token_path.read_text().strip()

            def make() -> httpx.AsyncClient:
                return httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app),
                    base_url="http://127.0.0.1",
                    headers={"Authorization": f"Bearer {token}"},
                )

            before: list[int] = []

            def mark() -> None:
                before[:] = [svc.db.commits, svc.db.jobs]

            load = await hammer(make, concurrency, duration, mark)
            commits, jobs = svc.db.commits - before[0], svc.db.jobs - before[1]
            assert jobs == load.requests, (jobs, load.requests)  # nothing else wrote
            return load, load.requests, commits

    return asyncio.run(main())


def lmsp_store(work: Path, concurrency: int, duration: float) -> tuple[Load, int]:
    """The create transaction alone (response + task + events, rendered objects) from
    ``concurrency`` threads through the group-commit writer: storage without HTTP."""
    import threading

    from lmsp.app.root import open_service
    from lmsp.config import Settings
    from lmsp.protocol.request import from_stored
    from lmsp.store import responses

    settings = Settings(data_dir=work / "store-data", enable_test_engine=True)
    svc = open_service(settings)
    owner = (
        svc.db.reader()
        .execute("SELECT value FROM service_config WHERE key = 'owner_client_id'")
        .fetchone()[0]
    )
    latencies: list[float] = []
    commits_before = svc.db.commits
    stop_at = time.perf_counter() + duration

    def worker(n: int) -> None:
        i = 0
        while time.perf_counter() < stop_at:
            body = {"model": TEST_MODEL, "input": f"w{n}-{i}", "background": True, "seed": 1}
            t0 = time.perf_counter()

            def create(c: sqlite3.Connection, body: dict[str, Any] = body) -> Any:
                return responses.create(
                    c,
                    client_id=owner,
                    request=from_stored(body),
                    on_restart="fail",
                    max_queue=10**9,
                    key=None,
                )

            svc.db.write_sync(create)
            latencies.append(time.perf_counter() - t0)
            i += 1

    start = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    seconds = time.perf_counter() - start
    commits = svc.db.commits - commits_before
    svc.db.close()
    return Load(len(latencies), seconds, latencies), commits


def sqlite_naive(work: Path, duration: float) -> Load:
    """One INSERT + COMMIT per row, WAL, synchronous=FULL: the naive durable baseline."""
    path = work / "naive.db"
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, created_at REAL, data TEXT)")
    payload = json.dumps({"model": TEST_MODEL, "input": "durable hello", "pad": "x" * 1500})
    latencies: list[float] = []
    start = time.perf_counter()
    stop_at = start + duration
    while time.perf_counter() < stop_at:
        t0 = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT INTO rows (created_at, data) VALUES (?, ?)", (t0, payload))
        conn.execute("COMMIT")
        latencies.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    conn.close()
    return Load(len(latencies), seconds, latencies)


def bench_writes(work: Path, concurrency: int, duration: float) -> list[list[str]]:
    naive = sqlite_naive(work, duration)
    served = lmsp_writes(work, concurrency, duration)
    local, requests, commits = lmsp_in_process(work, concurrency, duration)
    stored, store_commits = lmsp_store(work, 16, duration)

    def row(name: str, load: Load, ratio: str, commit_note: str) -> list[str]:
        return [
            name,
            f"{load.requests}",
            f"{load.rate:.0f}",
            f"{percentile(load.latencies, 0.5) * 1000:.1f}",
            f"{percentile(load.latencies, 0.99) * 1000:.1f}",
            ratio,
            commit_note,
        ]

    rows = [
        row("raw SQLite, 1 INSERT+COMMIT per row", naive, "1.00", "1 per row"),
        row(
            f"lmsp serve, HTTP, {concurrency} clients",
            served,
            f"{served.rate / naive.rate:.2f}",
            "not exposed",
        ),
        row(
            f"lmsp in-process ASGI, {concurrency} clients, runner paused",
            local,
            f"{local.rate / naive.rate:.2f}",
            f"{commits} for {requests} ({requests / max(commits, 1):.1f}/commit)",
        ),
        row(
            "lmsp store: create transactions, 16 threads, group commit",
            stored,
            f"{stored.rate / naive.rate:.2f}",
            f"{store_commits} for {stored.requests}"
            f" ({stored.requests / max(store_commits, 1):.1f}/commit)",
        ),
    ]
    table(
        f"(b) durable writes: {duration:.0f} s each, WAL + synchronous=FULL, "
        "202 only after COMMIT; lmsp serve runs its tasks meanwhile (test engine, no delay)",
        ["path", "requests", "per s", "p50 ms", "p99 ms", "vs raw", "commits"],
        rows,
    )
    return rows


@contextlib.contextmanager
def workdir(base: str | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lmsp-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def compiled_as_installed() -> None:
    """Compile lmsp's modules to bytecode, as ``pip install`` does for an installed
    package and as Python itself does on a first import: with ``PYTHONDONTWRITEBYTECODE``
    set (as on some CI machines) an editable checkout would otherwise compile every module
    again at each server start, about 0.2 s of the start a user never pays."""
    import compileall

    source = Path(__file__).resolve().parent.parent / "src"
    compileall.compile_dir(str(source), quiet=1)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("lmsp's modules compiled to bytecode (PYTHONDONTWRITEBYTECODE is set here)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="output tokens for (a)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions for (a)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients for (b)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each (b) run")
    parser.add_argument("--dir", default=None, help="where the data directories go")
    parser.add_argument(
        "--only",
        choices=[
            "generation",
            "writes",
            "constraints",
            "compare",
            "snapshots",
            "dialects",
            "embeddings",
            "hostile",
            "scaleout",
            "fairshare",
            "pull",
            "webhooks",
            "sharedwork",
            "mcp",
            "conversations",
            "remote",
            "websocket",
            "ceiling",
            "backlog",
            "reattach",
            "start",
        ],
        default=None,
    )
    args = parser.parse_args()
    if compare.quick():  # LMSP_BENCH_QUICK: a smoke run of the harness
        args.reps, args.tokens, args.seconds = 1, 32, 2.0

    began = time.perf_counter()
    with workdir(args.dir) as work:
        print(
            f"lmsp bench: {platform.platform()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, data in {work}"
        )
        compiled_as_installed()
        if args.only in (None, "generation"):
            bench_generation(work, args.tokens, args.reps)
        if args.only in (None, "writes"):
            bench_writes(work, args.clients, args.seconds)
        if args.only in (None, "constraints"):
            from bench.constraints import bench_constraints

            bench_constraints(args.tokens, args.reps)
        if args.only in (None, "snapshots"):
            from bench.snapshots import bench_snapshots

            bench_snapshots()
        if args.only in (None, "dialects"):
            from bench.dialects import bench_dialects

            bench_dialects(work, args.tokens, args.reps, table)
        if args.only in (None, "embeddings"):
            from bench.embeddings import bench_embeddings

            bench_embeddings(work, 1 if compare.quick() else 3, table)
        if args.only in (None, "hostile"):
            from bench.hostile import bench_hostile

            bench_hostile(1 if compare.quick() else 3, table)
        if args.only in (None, "scaleout"):
            from bench.scaleout import bench_scaleout

            bench_scaleout(work, 64, args.seconds, table)
        if args.only in (None, "fairshare"):
            from bench.fairshare import bench_fairshare

            bench_fairshare(work, args.seconds, table, compare.quick())
        if args.only in (None, "pull"):
            from bench.pull import bench_pull

            bench_pull(work, 1 if compare.quick() else 3, table)
        if args.only in (None, "webhooks"):
            from bench.webhooks import bench_webhooks

            bench_webhooks(work, args.clients, args.seconds, table)
        if args.only in (None, "sharedwork"):
            from bench.sharedwork import bench_sharedwork

            bench_sharedwork(1 if compare.quick() else 3, table, quick=compare.quick())
        if args.only in (None, "mcp"):
            from bench.mcptools import bench_mcp

            bench_mcp(work, 1 if compare.quick() else 3, table)
        if args.only in (None, "conversations"):
            from bench.conversations import bench_conversations

            if compare.quick():
                bench_conversations(2, 400, 3000, table, n_ctx=2048)
            else:
                bench_conversations(table=table)
        if args.only in (None, "remote"):
            from bench.remote import bench_remote

            bench_remote(work, table)
        if args.only in (None, "websocket"):
            from bench.websocket import bench_websocket

            bench_websocket(work, args.tokens, args.reps, table)
        if args.only in (None, "ceiling"):
            from bench.ceiling import bench_ceiling

            if compare.quick():
                bench_ceiling(work, table, args.seconds, 1, (24,))
            else:
                bench_ceiling(work, table)
        if args.only in (None, "backlog"):
            from bench.backlog import bench_backlog

            bench_backlog(work, table, (100, 1_000) if compare.quick() else (100, 1_000, 10_000))
        if args.only in (None, "reattach"):
            from bench.reattach import bench_reattach

            bench_reattach(work, 1 if compare.quick() else 3, table)
        if args.only in (None, "start"):
            from bench.start import bench_start

            bench_start(work, 2 if compare.quick() else 7, table)
        if args.only in (None, "compare"):
            compare.run(work, table)
    print(f"\ntotal {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
