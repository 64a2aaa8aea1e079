"""lmsp against llama.cpp's own ``llama-server``: the benchmarks of issue 10, in one run.

Both servers run the same GGUF (the bundled SmolLM2-135M) with the same thread count;
``llama-server`` is built from the installed llama-cpp-python's source distribution
(:mod:`bench.llama_server`) and started with ``-np 8``. lmsp runs as a real ``lmsp
serve`` subprocess with its own defaults, or the ``LMSP_*`` settings of the environment
(``LMSP_PARALLEL=8 make bench``). Every figure is a median over repetitions where a
figure repeats; the measurements are:

- one stream, 256 tokens, greedy: tokens/s of each server;
- 8 concurrent streams of 128 tokens: aggregate tokens/s, and each server's health
  probe latency meanwhile;
- time to first token of a request sharing a ~1,500-token system prompt with the one
  before it, with the cached prompt tokens each server reports; for lmsp also right
  after a restart (its durable prefix cache), the model already loaded by an unrelated
  request;
- resume after ``kill -9`` of a task ~1,000 tokens in: restart to its next token;
- 64 concurrent durable creates while 8 streams generate: creates/s, p50/p99, errors,
  and ``/healthz`` p50/p99 meanwhile;
- resident memory with 8 sequences vs 1 (peak RSS of each server process).

``LMSP_BENCH_QUICK=1`` runs everything small (one repetition, fewer tokens): a smoke run
of the harness, not figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from bench import llama_server
from tests.helpers import Server, open_db

MODEL = "smollm2-135m-instruct"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
SUBJECTS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a baker who opens a shop on the moon",
    "a cartographer mapping an island that moves",
    "a clockmaker whose clocks run backwards",
    "a gardener who grows a forest in a city",
    "a librarian who guards a book nobody can read",
    "a sailor who crosses a sea of glass",
    "a child who teaches a robot to paint",
]


def quick() -> bool:
    return os.environ.get("LMSP_BENCH_QUICK", "") not in ("", "0")


@dataclass
class Plan:
    """How big each benchmark is (full, or ``LMSP_BENCH_QUICK``)."""

    reps: int = 3
    single_tokens: int = 256
    streams: int = 8
    stream_tokens: int = 128
    prefix_tokens: int = 1500
    resume_at: int = 1000
    creators: int = 64
    create_seconds: float = 10.0

    @classmethod
    def pick(cls) -> Plan:
        if quick():
            return cls(1, 48, 8, 24, 1500, 150, 64, 3.0)
        return cls()


def threads() -> int:
    return max(1, int(os.environ.get("LMSP_THREADS", "0")) or (os.cpu_count() or 1))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def story(subject: str) -> str:
    return f"Write a long story about {subject}."


def system_prompt(tokens: int) -> str:
    """A deterministic system prompt of roughly ``tokens`` tokens (rules, as agents send)."""
    rules = []
    n = 0
    while n * 14 < tokens:  # about 14 tokens a rule with this tokenizer
        n += 1
        rules.append(f"Rule {n}: when the user mentions item {n * 7 % 97}, answer briefly.")
    return "You are a careful assistant. Follow these rules.\n" + "\n".join(rules)


# -- one streamed request to either server --------------------------------------------------


@dataclass
class Stream:
    tokens: int = 0
    seconds: float = 0.0
    first: float | None = None  # seconds to the first text
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    text: str = ""
    error: str | None = None


def sse_lines(answer: httpx.Response) -> Iterator[tuple[str, str]]:
    event = ""
    for line in answer.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, line[5:].strip()
            event = ""


def lmsp_stream(
    http: httpx.Client, messages: list[dict[str, str]], max_tokens: int, **extra: Any
) -> Stream:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": messages,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    out = Stream()
    start = time.perf_counter()
    try:
        with http.stream("POST", "/v1/responses", json=body) as answer:
            if answer.status_code != 200:
                answer.read()
                out.error = f"{answer.status_code}: {answer.text[:200]}"
                return out
            for event, data in sse_lines(answer):
                if event == "response.output_text.delta":
                    if out.first is None:
                        out.first = time.perf_counter() - start
                    out.text += json.loads(data)["delta"]
                elif event in TERMINAL:
                    final = json.loads(data)["response"]
                    usage = final.get("usage") or {}
                    out.tokens = usage.get("output_tokens", 0)
                    out.prompt_tokens = usage.get("input_tokens", 0)
                    details = usage.get("input_tokens_details") or {}
                    out.cached_tokens = details.get("cached_tokens")
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    out.seconds = time.perf_counter() - start
    return out


def llama_stream(
    http: httpx.Client, messages: list[dict[str, str]], max_tokens: int, **extra: Any
) -> Stream:
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    out = Stream()
    chunks = 0
    start = time.perf_counter()
    try:
        with http.stream("POST", "/v1/chat/completions", json=body) as answer:
            if answer.status_code != 200:
                answer.read()
                out.error = f"{answer.status_code}: {answer.text[:200]}"
                return out
            for _, data in sse_lines(answer):
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text:
                        if out.first is None:
                            out.first = time.perf_counter() - start
                        out.text += text
                        chunks += 1
                usage = chunk.get("usage")
                if usage:
                    out.tokens = usage.get("completion_tokens", 0)
                    out.prompt_tokens = usage.get("prompt_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    out.cached_tokens = details.get("cached_tokens")
                timings = chunk.get("timings")
                if timings and out.cached_tokens is None and "cache_n" in timings:
                    out.cached_tokens = timings["cache_n"]
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    out.seconds = time.perf_counter() - start
    out.tokens = out.tokens or chunks
    return out


Runner = Callable[..., Stream]


@dataclass
class Side:
    """One server under test: how to stream from it, probe it, and read its memory."""

    name: str
    url: str
    headers: dict[str, str]
    stream: Runner
    health: str
    pid: Callable[[], int]

    def client(self, timeout: float = 600) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def rss(self) -> tuple[int, int]:
        """(current, peak) resident memory of the server process, bytes."""
        return memory(self.pid())


def memory(pid: int) -> tuple[int, int]:
    now = peak = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return now, peak


def lmsp_side(server: Server) -> Side:
    def pid() -> int:
        assert server.proc is not None
        return server.proc.pid

    return Side(
        "lmsp",
        server.url,
        {"Authorization": f"Bearer {server.token}"},
        lmsp_stream,
        "/healthz",
        pid,
    )


def llama_side(server: llama_server.LlamaServer) -> Side:
    def pid() -> int:
        assert server.proc is not None
        return server.proc.pid

    return Side("llama-server", server.url, {}, llama_stream, "/health", pid)


# -- probes ------------------------------------------------------------------------------


class Prober:
    """Polls a health route from its own thread, one request at a time, while work runs."""

    def __init__(self, url: str, every: float = 0.02) -> None:
        self.url = url
        self.every = every
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = http.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.latencies.append(time.perf_counter() - t0)
                else:
                    self.errors += 1
                self._stop.wait(self.every)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        p50 = percentile(self.latencies, 0.5) * 1000
        p99 = percentile(self.latencies, 0.99) * 1000
        return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(self.latencies)} probes)"


# -- the benchmarks ----------------------------------------------------------------------


def messages_for(subject: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": story(subject)}]


@dataclass
class Concurrent:
    tokens: int
    seconds: float
    errors: list[str]
    probes: Prober

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def concurrent(side: Side, n: int, max_tokens: int) -> Concurrent:
    results: list[Stream] = [Stream() for _ in range(n)]

    def one(i: int) -> None:
        with side.client() as http:
            results[i] = side.stream(http, messages_for(SUBJECTS[i % len(SUBJECTS)]), max_tokens)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    with Prober(side.url + side.health) as probes:
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    return Concurrent(sum(r.tokens for r in results), seconds, errors, probes)


@dataclass
class Figures:
    """Everything measured, for the summary table."""

    rows: list[list[str]] = field(default_factory=list)

    def add(self, what: str, lmsp: str, llama: str, ratio: str, goal: str) -> None:
        self.rows.append([what, lmsp, llama, ratio, goal])


def fmt_ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and a == a and b == b else "n/a"


def bench_generation(lm: Side, ll: Side, plan: Plan, figures: Figures) -> None:
    single: dict[str, list[Stream]] = {lm.name: [], ll.name: []}
    with lm.client() as lh, ll.client() as llh:
        for _ in range(plan.reps):  # interleaved, so noise hits both alike
            single[lm.name].append(lm.stream(lh, messages_for(SUBJECTS[0]), plan.single_tokens))
            single[ll.name].append(ll.stream(llh, messages_for(SUBJECTS[0]), plan.single_tokens))
    rss1 = {s.name: s.rss()[0] for s in (lm, ll)}
    rates = {k: median([r.tokens / r.seconds for r in v if not r.error]) for k, v in single.items()}
    print(f"\none stream, {plan.single_tokens} tokens max, greedy, median of {plan.reps}:")
    for k, runs in single.items():
        errors = [r.error for r in runs if r.error]
        print(
            f"  {k:13} {rates[k]:6.1f} tok/s  ({median([r.tokens for r in runs]):.0f} tokens,"
            f" first text {median([r.first or 0 for r in runs]) * 1000:.0f} ms)"
            + (f"  errors: {errors}" if errors else "")
        )
    same = single[lm.name][0].text == single[ll.name][0].text
    print(f"  same greedy text: {'yes' if same else 'no'}")
    figures.add(
        f"one stream, {plan.single_tokens} tokens (tok/s)",
        f"{rates[lm.name]:.1f}",
        f"{rates[ll.name]:.1f}",
        fmt_ratio(rates[lm.name], rates[ll.name]),
        ">= 0.97",
    )

    runs: dict[str, list[Concurrent]] = {lm.name: [], ll.name: []}
    for _ in range(plan.reps):
        for side in (lm, ll):
            runs[side.name].append(concurrent(side, plan.streams, plan.stream_tokens))
    agg = {k: median([r.rate for r in v]) for k, v in runs.items()}
    print(
        f"\n{plan.streams} concurrent streams of {plan.stream_tokens} tokens,"
        f" aggregate, median of {plan.reps}:"
    )
    for k, rs in runs.items():
        errors = [e for r in rs for e in r.errors]
        print(
            f"  {k:13} {agg[k]:6.1f} tok/s  (health meanwhile: {rs[-1].probes.summary()})"
            + (f"  errors: {errors[:3]}" if errors else "")
        )
    figures.add(
        f"{plan.streams} streams x {plan.stream_tokens} tokens, aggregate (tok/s)",
        f"{agg[lm.name]:.1f}",
        f"{agg[ll.name]:.1f}",
        fmt_ratio(agg[lm.name], agg[ll.name]),
        ">= 1.0",
    )
    rss8 = {s.name: s.rss()[1] for s in (lm, ll)}
    mib = 1024 * 1024
    print("\nresident memory (after one stream; peak after the concurrent streams):")
    for s in (lm, ll):
        print(
            f"  {s.name:13} 1 sequence {rss1[s.name] / mib:6.0f} MiB,"
            f" {plan.streams} sequences {rss8[s.name] / mib:6.0f} MiB,"
            f" ratio {rss8[s.name] / rss1[s.name]:.2f}"
        )
    figures.add(
        f"RSS {plan.streams} sequences / 1",
        f"{rss8[lm.name] / rss1[lm.name]:.2f}",
        f"{rss8[ll.name] / rss1[ll.name]:.2f}",
        "",
        "lmsp <= 1.3",
    )


def prefix_messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def bench_prefix(
    lm: Side, ll: Side, plan: Plan, figures: Figures, restart: Callable[[], Side]
) -> None:
    system = system_prompt(plan.prefix_tokens)
    results: dict[str, tuple[Stream, Stream]] = {}
    for side in (lm, ll):
        with side.client() as http:
            # the model loaded, by a request that shares nothing with the prefix
            side.stream(http, messages_for(SUBJECTS[5]), 1)
            cold = side.stream(http, prefix_messages(system, "What is rule 3 about?"), 8)
            warm = side.stream(http, prefix_messages(system, "And what is rule 12 about?"), 8)
        results[side.name] = (cold, warm)
    print(f"\ntime to first token, a ~{plan.prefix_tokens}-token system prompt:")
    for name, (cold, warm) in results.items():
        print(
            f"  {name:13} first request {(cold.first or 0) * 1000:7.0f} ms"
            f" ({cold.prompt_tokens} prompt tokens);"
            f" second {(warm.first or 0) * 1000:7.0f} ms"
            f" (cached_tokens {warm.cached_tokens})"
            + (f"  errors: {cold.error} {warm.error}" if cold.error or warm.error else "")
        )
    lm_warm = results[lm.name][1].first or float("nan")
    ll_warm = results[ll.name][1].first or float("nan")
    ll_cold = results[ll.name][0].first or float("nan")
    figures.add(
        "TTFT, 2nd request sharing the prefix (ms)",
        f"{lm_warm * 1000:.0f} (cached {results[lm.name][1].cached_tokens})",
        f"{ll_warm * 1000:.0f} (cached {results[ll.name][1].cached_tokens})",
        fmt_ratio(lm_warm, ll_warm),
        "<= 1.5, cached >= 1400",
    )
    side = restart()
    with side.client() as http:
        side.stream(http, messages_for(SUBJECTS[6]), 1)  # load the model, nothing shared
        after = side.stream(http, prefix_messages(system, "Is rule 20 strict?"), 8)
    first = after.first or float("nan")
    print(
        f"  lmsp after a restart: {first * 1000:.0f} ms (cached_tokens {after.cached_tokens});"
        f" {first / lm_warm:.2f} x its warm figure"
        + (f"  error: {after.error}" if after.error else "")
    )
    figures.add(
        "TTFT of that request after a restart (ms)",
        f"{first * 1000:.0f} (cached {after.cached_tokens})",
        f"{ll_cold * 1000:.0f} (full prefill)",
        f"{first / lm_warm:.2f} x warm",
        "<= 3 x warm",
    )


def bench_resume(work: Path, env: dict[str, str], plan: Plan, figures: Figures) -> None:
    """kill -9 a task ``plan.resume_at`` tokens in; restart; time to its next token."""
    from llama_cpp import Llama

    from lmsp.bootstrap import bundled_model_path

    vocab = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    server = Server(work / "resume-data", env=env).start()
    try:
        with server.client(timeout=600) as http:
            body = {
                "model": MODEL,
                "input": story(SUBJECTS[2]) + " Make it very long, with many chapters.",
                "max_output_tokens": plan.resume_at * 3,
                "temperature": 0,
                "background": True,
                "stream": True,
                "on_restart": "resume",
            }
            text = ""
            last = -1
            response_id = ""
            killed_at = 0
            with http.stream("POST", "/v1/responses", json=body) as answer:
                for event, data in sse_lines(answer):
                    payload = json.loads(data)
                    last = payload.get("sequence_number", last)
                    if event == "response.created":
                        response_id = payload["response"]["id"]
                    if event == "response.output_text.delta":
                        text += payload["delta"]
                        killed_at = len(vocab.tokenize(text.encode(), add_bos=False))
                        if killed_at >= plan.resume_at:
                            break
                    if event in TERMINAL:
                        break
        server.kill()
        if killed_at < plan.resume_at:
            print(f"\nresume: the task ended after {killed_at} tokens; nothing to resume")
            return
        # what was committed before the kill (a little more than the stream showed)
        with contextlib.closing(open_db(server.data_dir)) as conn:
            last = conn.execute(
                "SELECT last_sequence_number FROM tasks t JOIN responses r"
                " ON r.id = t.response_id WHERE r.id = ?",
                (response_id,),
            ).fetchone()[0]
        launched = time.perf_counter()
        server.launch()
        server.wait_healthy()
        healthy = time.perf_counter() - launched
        with server.client(timeout=600) as http:
            path = f"/v1/responses/{response_id}?stream=true&starting_after={last}"
            nxt: float | None = None
            with http.stream("GET", path) as answer:
                for event, _ in sse_lines(answer):
                    if event == "response.output_text.delta":
                        nxt = time.perf_counter() - launched
                        break
                    if event in TERMINAL:
                        break
            http.post(f"/v1/responses/{response_id}/cancel")
    finally:
        server.stop()
        vocab.close()
    shown = f"{nxt:.2f} s" if nxt is not None else "no next token"
    print(
        f"\nresume after kill -9 at ~{killed_at} tokens: restart to healthy {healthy:.2f} s,"
        f" to the next token {shown}"
    )
    figures.add(
        f"resume after kill -9, ~{killed_at} tokens in (s)",
        shown,
        "(no durable tasks)",
        "",
        "<= 2 s",
    )


async def _creates(side: Side, n: int, seconds: float) -> tuple[int, list[float], list[str]]:
    body = {
        "model": MODEL,
        "input": "durable hello",
        "background": True,
        "max_output_tokens": 8,
    }
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(
        base_url=side.url, headers=side.headers, limits=limits, timeout=120
    ) as http:

        async def worker(stop_at: float) -> None:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    answer = await http.post("/v1/responses", json=body)
                    ok = answer.status_code == 202
                    if not ok:
                        errors.append(f"{answer.status_code}: {answer.text[:120]}")
                except httpx.HTTPError as exc:
                    ok = False
                    errors.append(repr(exc))
                if ok:
                    latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(worker(start + seconds) for _ in range(n)))
        return len(latencies), latencies, errors


def bench_creates(server: Server, plan: Plan, figures: Figures) -> None:
    """``plan.creators`` clients create background responses while 8 streams generate;
    the server is killed at the end (its queue is long by then)."""
    lm = lmsp_side(server)
    streams: list[threading.Thread] = []
    stop = threading.Event()

    def generate(i: int) -> None:
        with lm.client() as http:
            while not stop.is_set():
                lm.stream(http, messages_for(SUBJECTS[i]), plan.stream_tokens * 4)

    for i in range(plan.streams):
        streams.append(threading.Thread(target=generate, args=(i,), daemon=True))
        streams[-1].start()
    time.sleep(2.0)  # the streams are running
    with Prober(lm.url + lm.health) as probes:
        done, latencies, errors = asyncio.run(_creates(lm, plan.creators, plan.create_seconds))
    stop.set()
    server.kill()
    for t in streams:
        t.join(timeout=60)
    p50 = percentile(latencies, 0.5) * 1000
    p99 = percentile(latencies, 0.99) * 1000
    print(
        f"\n{plan.creators} concurrent durable creates for {plan.create_seconds:.0f} s while"
        f" {plan.streams} streams generate: {done / plan.create_seconds:.0f}/s,"
        f" p50 {p50:.1f} ms, p99 {p99:.1f} ms, {len(errors)} errors"
        + (f" ({errors[:2]})" if errors else "")
    )
    print(f"  /healthz meanwhile: {probes.summary()}, {probes.errors} errors")
    figures.add(
        f"{plan.creators} creates during {plan.streams} streams: p99 ms (errors)",
        f"{p99:.0f} ({len(errors)}), {done / plan.create_seconds:.0f}/s",
        "(no durable creates)",
        "",
        "<= 50 ms, 0 errors",
    )
    figures.add(
        "/healthz p99 meanwhile (ms)",
        f"{percentile(probes.latencies, 0.99) * 1000:.1f}",
        "",
        "",
        "<= 20 ms",
    )


def run(work: Path, table: Callable[[str, list[str], list[list[str]]], None]) -> None:
    """All the side-by-side benchmarks; ``table`` prints the summary."""
    from lmsp.bootstrap import bundled_model_path
    from lmsp.config import Settings

    plan = Plan.pick()
    settings = Settings()
    binary = llama_server.ensure_built()
    n = threads()
    env = {"LMSP_THREADS": str(n), "LMSP_MAX_QUEUE": "1000000", "LMSP_DEFAULT_ON_RESTART": "fail"}
    parallel = os.environ.get("LMSP_PARALLEL", str(settings.parallel))
    print(
        f"\nlmsp vs llama-server ({binary.parent.parent.parent.name}): {MODEL}, {n} threads,"
        f" n_ctx {settings.n_ctx} a sequence, llama-server -np {plan.streams},"
        f" lmsp LMSP_PARALLEL={parallel}" + (" [QUICK smoke run]" if quick() else "")
    )
    figures = Figures()
    ll_server = llama_server.LlamaServer(
        binary,
        bundled_model_path(),
        threads=n,
        parallel=plan.streams,
        n_ctx=settings.n_ctx,
        log=work / "llama-server.log",
    ).start()
    lm_server = Server(work / "lmsp-data", env=env).start()
    servers = [lm_server]
    try:
        lm, ll = lmsp_side(lm_server), llama_side(ll_server)
        with lm.client() as http:  # warm-up: lmsp loads its model on first use
            lm.stream(http, messages_for(SUBJECTS[7]), 4)
        with ll.client() as http:
            ll.stream(http, messages_for(SUBJECTS[7]), 4)
        bench_generation(lm, ll, plan, figures)

        def restart() -> Side:
            lm_server.stop()
            lm_server.start()
            return lmsp_side(lm_server)

        bench_prefix(lm, ll, plan, figures, restart)
        ll_server.stop()  # from here on lmsp only: leave it the machine
        lm_server.stop()
        busy = Server(work / "creates-data", env=env).start()
        servers.append(busy)
        bench_creates(busy, plan, figures)
        bench_resume(work, dict(env, LMSP_DEFAULT_ON_RESTART="resume"), plan, figures)
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                server.kill()
        ll_server.stop()
    table(
        "summary: lmsp vs llama-server" + (" (QUICK smoke run: not figures)" if quick() else ""),
        ["benchmark", "lmsp", "llama-server", "ratio", "goal"],
        figures.rows,
    )
