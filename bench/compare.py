"""lmsp against llama.cpp's own ``llama-server``: the benchmarks of issues 10 and 16, in
one run.

Both servers run the same GGUF (the bundled SmolLM2-135M) with the same thread count:
``llama-server`` is built from the installed llama-cpp-python's source distribution
(:mod:`bench.llama_server`) and started twice with ``-np 8``, once with its default flags
and once with ``--no-repack -fa on`` (the kernels lmsp runs); the faster of the two on
each row is the reference. lmsp runs as a real ``lmsp serve`` subprocess with
``LMSP_PARALLEL=8`` sequences of ``LMSP_N_CTX`` tokens each (default 8,192, the model's
trained context) in one context (either can be set in the environment; the header prints
what ran), llama-server with the same context per slot. Each goal row of the issue is
measured as it is worded there, repeated ``Plan.reps`` times where it repeats, medians:

- one stream, 256 tokens, greedy: output tokens / (request to last token);
- 8 concurrent streams of 128 tokens: all output tokens / wall time of the 8, and lmsp's
  API process's CPU meanwhile (not probed: one more batch gives the health route's
  latency under that load);
- time to first token of a second request sharing a ~1,500-token system prompt (counted
  with the model's tokenizer) with the request before it, and the ``cached_tokens`` each
  server reports for it (lmsp: ``usage.input_tokens_details.cached_tokens``);
- time to first token of that second request again, right after both servers restart
  (lmsp: its durable prefix cache; llama-server: a full prefill), against lmsp's warm
  figure;
- resume after ``kill -9`` of a task ~1,000 tokens in: new process launched to its
  next token;
- 64 concurrent durable creates while 8 streams generate: p99 and errors, and
  ``/healthz`` p99 meanwhile (both measured from processes of their own);
- memory: resident memory of the lmsp process tree while 1 stream runs and while 8 run,
  the same server (one model, one context);
- the cold prompt: time to first token of the first request with a ~1,500-token system
  prompt (a full prefill on both sides);
- ``kill -9`` of the engine process while 8 streams generate: durable creates and
  ``/healthz`` meanwhile (p99, errors), measured from processes of their own;
- ``LMSP_EXACT=1``: 8 streams aggregate again on a server in exact mode, against the
  fast default's figure.

Every row prints lmsp's figure, llama-server's where it applies, the ratio, the goal and
MET / MISSED. If ``llama-server`` cannot be built or started the lmsp rows still run and
the rows that need it say ``n/a``. ``LMSP_BENCH_QUICK=1`` runs everything small (one
repetition, fewer tokens): a smoke run of the harness, not figures.
``LMSP_BENCH_PARTS`` (comma-separated: ``generation``, ``prefix``, ``exact``,
``creates``, ``kill``, ``resume``) runs only those parts, to look at one row again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import llama_server
from bench.clients import (
    MODEL,
    TERMINAL,
    Prober,
    Probes,
    RssPeak,
    Side,
    Stream,
    busy_cpus,
    creates_process,
    llama_stream,
    lmsp_stream,
    median,
    percentile,
    probe_process,
    processes,
    sse_lines,
)
from tests.helpers import Server, open_db

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
N_CTX = 8192  # a sequence's context: lmsp's default for this model (its trained context)


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
    steady_clients: int = 8
    steady_rate: float = 50.0

    @classmethod
    def pick(cls) -> Plan:
        if quick():
            return cls(1, 48, 8, 24, 1500, 150, 64, 3.0)
        return cls()


def threads() -> int:
    return max(1, int(os.environ.get("LMSP_THREADS", "0")) or (os.cpu_count() or 1))


def story(subject: str) -> str:
    return f"Write a long story about {subject}."


def messages_for(subject: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": story(subject)}]


Count = Callable[[str], int]  # tokens of a text with the model's tokenizer


def system_prompt(count: Count, tokens: int, salt: int = 0) -> str:
    """A deterministic system prompt of ``tokens`` tokens or a few more (rules, as agents
    send); each ``salt`` gives one that shares no prefix with another's."""
    head = f"Session {salt}. You are a careful assistant. Follow these rules.\n"
    rules: list[str] = []
    n = 0
    while count(head + "\n".join(rules)) < tokens:
        n += 1
        rules.append(
            f"Rule {n}: when the user mentions item {(n * 7 + salt * 13) % 97}, answer briefly."
        )
    return head + "\n".join(rules)


def prefix_messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


# -- the summary ---------------------------------------------------------------------------


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("MET" if met else "MISSED")


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def num(value: float, spec: str = ".1f", scale: float = 1.0) -> str:
    return "n/a" if math.isnan(value) else format(value * scale, spec)


@dataclass
class Figures:
    """The summary table: one row per goal of the issue."""

    rows: list[list[str]] = field(default_factory=list)

    def add(
        self, what: str, lmsp: str, llama: str, ratio: str, goal: str, met: bool | None
    ) -> None:
        self.rows.append([what, lmsp, llama, ratio, goal, verdict(met)])


def at_most(value: float, bound: float) -> bool | None:
    return None if math.isnan(value) else value <= bound


def at_least(value: float, bound: float) -> bool | None:
    return None if math.isnan(value) else value >= bound


# -- the sides -----------------------------------------------------------------------------


def lmsp_side(server: Server, name: str = "lmsp", model: str = MODEL) -> Side:
    """Streams through ``server``'s ``/v1/responses`` on ``model``."""

    def pid() -> int:
        assert server.proc is not None
        return server.proc.pid

    return Side(
        name,
        server.url,
        {"Authorization": f"Bearer {server.token}"},
        lambda http, messages, max_tokens, **extra: lmsp_stream(
            http, messages, max_tokens, model=model, **extra
        ),
        "/healthz",
        pid,
    )


def llama_side(server: llama_server.LlamaServer, name: str = "llama-server") -> Side:
    def pid() -> int:
        assert server.proc is not None
        return server.proc.pid

    return Side(name, server.url, {}, llama_stream, "/health", pid)


def errors_of(runs: list[Stream]) -> str:
    errors = [r.error for r in runs if r.error]
    return f"  errors: {errors[:3]}" if errors else ""


# -- generation and memory -----------------------------------------------------------------


@dataclass
class Concurrent:
    tokens: int
    seconds: float
    errors: list[str]
    probes: Probes
    rss: int
    cpu: float = math.nan  # CPU seconds of the side's own process (lmsp: the API's)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (not its children), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def concurrent(side: Side, n: int, max_tokens: int, probe: bool = False) -> Concurrent:
    """``n`` streams at once; with ``probe``, the side's health route polled meanwhile
    (every 20 ms, from this process). Throughput and CPU are measured unprobed: 50
    requests a second are work of their own, far dearer to a Python server than to a
    C++ one, and not what the row measures."""
    results: list[Stream] = [Stream() for _ in range(n)]

    def one(i: int) -> None:
        with side.client() as http:
            results[i] = side.stream(http, messages_for(SUBJECTS[i % len(SUBJECTS)]), max_tokens)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    prober = Prober(side.url + side.health) if probe else None
    with RssPeak(side.pid()) as rss, prober or contextlib.nullcontext():
        cpu = cpu_seconds(side.pid())
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - start
        cpu = cpu_seconds(side.pid()) - cpu
    errors = [r.error for r in results if r.error]
    tokens = sum(r.tokens for r in results)
    probes = prober.probes if prober is not None else Probes()
    return Concurrent(tokens, seconds, errors, probes, rss.peak, cpu)


def faster(values: dict[str, float], names: list[str], most: bool = True) -> str | None:
    """Of the llama-server sides ``names``, the one with the best figure (the most, or
    the least); ``None`` without any figure."""
    known = [n for n in names if not math.isnan(values.get(n, math.nan))]
    if not known:
        return None
    return (max if most else min)(known, key=lambda n: values[n])


def bench_generation(lm: Side, lls: list[Side], plan: Plan, figures: Figures) -> float:
    """One stream, 8 streams, memory; lmsp's 8-stream aggregate (for the exact row)."""
    sides = [lm, *lls]
    names = [s.name for s in lls]
    single: dict[str, list[Stream]] = {s.name: [] for s in sides}
    rss1: dict[str, list[int]] = {s.name: [] for s in sides}
    for _ in range(plan.reps):  # interleaved, so noise hits both alike
        for side in sides:
            with side.client() as http, RssPeak(side.pid()) as peak:
                single[side.name].append(
                    side.stream(http, messages_for(SUBJECTS[0]), plan.single_tokens)
                )
            rss1[side.name].append(peak.peak)
    rate = {k: median([r.rate for r in v if not r.error]) for k, v in single.items()}
    print(f"\none stream, {plan.single_tokens} tokens max, greedy, median of {plan.reps}:")
    for k, runs in single.items():
        print(
            f"  {k:13} {num(rate[k]):>6} tok/s  ({median([r.tokens for r in runs]):.0f} tokens,"
            f" {median([r.prompt_tokens for r in runs]):.0f} prompt tokens,"
            f" first text {median([r.first or math.nan for r in runs]) * 1000:.0f} ms)"
            + errors_of(runs)
        )
    for ll in lls:
        a, b = single[lm.name][0].text, single[ll.name][0].text
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        print(
            f"  same greedy text as {ll.name}: "
            + ("yes" if a == b else f"no, the same first {common or min(len(a), len(b))} chars")
        )
    best = faster(rate, names)
    ll_rate = rate[best] if best else math.nan
    r = ratio(rate[lm.name], ll_rate)
    figures.add(
        f"one stream, {plan.single_tokens} tokens (tok/s)",
        num(rate[lm.name]),
        f"{num(ll_rate)} {short(best)}",
        num(r, ".3f"),
        ">= 1.0 x llama-server",
        at_least(r, 1.0),
    )

    batches: dict[str, list[Concurrent]] = {s.name: [] for s in sides}
    for _ in range(plan.reps):
        for side in sides:
            batches[side.name].append(concurrent(side, plan.streams, plan.stream_tokens))
    # the health route's latency under the same load, in a batch of its own (probing
    # is load too: the batches above are not probed)
    probed = {s.name: concurrent(s, plan.streams, plan.stream_tokens, probe=True) for s in sides}
    agg = {k: median([c.rate for c in v]) for k, v in batches.items()}
    print(
        f"\n{plan.streams} concurrent streams of {plan.stream_tokens} tokens,"
        f" aggregate, median of {plan.reps}:"
    )
    for k, cs in batches.items():
        errors = [e for c in [*cs, probed[k]] for e in c.errors]
        print(
            f"  {k:13} {num(agg[k]):>6} tok/s"
            f"  ({median([c.tokens for c in cs]):.0f} tokens;"
            f" health in a probed batch of its own: {probed[k].probes.summary()},"
            f" {num(probed[k].rate)} tok/s)" + (f"  errors: {errors[:3]}" if errors else "")
        )
    best = faster(agg, names)
    ll_agg = agg[best] if best else math.nan
    r = ratio(agg[lm.name], ll_agg)
    figures.add(
        f"{plan.streams} streams x {plan.stream_tokens} tokens, aggregate (tok/s)",
        num(agg[lm.name]),
        f"{num(ll_agg)} {short(best)}",
        num(r, ".3f"),
        f">= 1.0 x llama-server -np {plan.streams}",
        at_least(r, 1.0),
    )
    runs = batches[lm.name]
    share = median([c.cpu / c.seconds for c in runs])
    per_token = median([c.cpu / max(1, c.tokens) for c in runs])
    print(
        f"  lmsp's API process meanwhile: {share * 100:.1f} % of a core,"
        f" {per_token * 1000:.2f} ms of CPU per generated token (medians)"
    )
    figures.add(
        f"API process CPU during {plan.streams} streams (% of a core)",
        f"{share * 100:.1f} ({per_token * 1000:.2f} ms a token)",
        "(one process)",
        "",
        "<= 10 %",
        at_most(share, 0.10),
    )

    mib = 1024 * 1024
    one = {k: median([float(v) for v in rss1[k]]) for k in rss1}
    many = {k: median([float(c.rss) for c in v]) for k, v in batches.items()}
    print(
        f"\nresident memory, the same server: peak while 1 stream runs,"
        f" while {plan.streams} run (medians):"
    )
    for k in one:
        print(
            f"  {k:13} 1 sequence {one[k] / mib:6.0f} MiB,"
            f" {plan.streams} sequences {many[k] / mib:6.0f} MiB,"
            f" ratio {ratio(many[k], one[k]):.2f}"
        )
    r = ratio(many[lm.name], one[lm.name])
    ll = next((s for s in lls if s.name == best), None)
    ll_r = ratio(many[ll.name], one[ll.name]) if ll is not None else math.nan
    figures.add(
        f"RSS {plan.streams} sequences / 1 (MiB)",
        f"{num(r, '.2f')} ({one[lm.name] / mib:.0f} -> {many[lm.name] / mib:.0f})",
        f"{num(ll_r, '.2f')}"
        + (f" ({one[ll.name] / mib:.0f} -> {many[ll.name] / mib:.0f}) {short(best)}" if ll else ""),
        num(r, ".3f"),
        "lmsp <= 1.3",
        at_most(r, 1.3),
    )
    return agg[lm.name]


def short(name: str | None) -> str:
    """Which llama-server a figure is from, briefly (``[defaults]``, ``[-fa on]``)."""
    if not name:
        return ""
    return "[defaults]" if "defaults" in name else "[-fa on]"


# -- shared prefixes -----------------------------------------------------------------------

QUESTIONS = ("What is rule 3 about?", "And what is rule 12 about?")


def bench_prefix(
    sides: list[Side],
    plan: Plan,
    figures: Figures,
    count: Count,
    restart: Callable[[], list[Side]],
) -> None:
    """Per repetition a prefix of its own: a first request (a full prefill), a second
    sharing its system prompt (the warm figure); then both servers restart and that
    second request comes again ("TTFT of that request right after a restart")."""
    systems = [system_prompt(count, plan.prefix_tokens, salt) for salt in range(plan.reps)]
    sizes = [count(s) for s in systems]
    first: dict[str, list[Stream]] = {s.name: [] for s in sides}
    second: dict[str, list[Stream]] = {s.name: [] for s in sides}
    after: dict[str, list[Stream]] = {s.name: [] for s in sides}
    for system in systems:
        for side in sides:
            with side.client() as http:
                first[side.name].append(side.stream(http, prefix_messages(system, QUESTIONS[0]), 8))
                second[side.name].append(
                    side.stream(http, prefix_messages(system, QUESTIONS[1]), 8)
                )
    sides = restart()
    for side in sides:
        with side.client() as http:
            side.stream(http, messages_for(SUBJECTS[6]), 1)  # loads the model, shares nothing
            for system in systems:
                after[side.name].append(side.stream(http, prefix_messages(system, QUESTIONS[1]), 8))

    def ttft(runs: list[Stream]) -> float:
        return median([r.first if r.first is not None else math.nan for r in runs])

    def cached(runs: list[Stream]) -> int | None:
        values = [r.cached_tokens for r in runs]
        return None if any(v is None for v in values) else min(v for v in values if v is not None)

    print(
        f"\ntime to first token, a system prompt of {median([float(s) for s in sizes]):.0f}"
        f" tokens, medians of {plan.reps} prefixes:"
    )
    for side in sides:
        k = side.name
        print(
            f"  {k:13} first request {num(ttft(first[k]), '.0f', 1000):>7} ms"
            f" ({median([float(r.prompt_tokens) for r in first[k]]):.0f} prompt tokens);"
            f" second {num(ttft(second[k]), '.0f', 1000):>7} ms"
            f" (cached_tokens, least: {cached(second[k])});"
            f" after a restart {num(ttft(after[k]), '.0f', 1000):>7} ms"
            f" (cached_tokens, least: {cached(after[k])})"
            + errors_of(first[k] + second[k] + after[k])
        )
    lm = sides[0].name
    names = [s.name for s in sides[1:]]
    lm_cold = ttft(first[lm])
    colds = {k: ttft(first[k]) for k in names}
    ll = faster(colds, names, most=False)
    ll_cold = colds[ll] if ll else math.nan
    r = ratio(lm_cold, ll_cold)
    figures.add(
        f"TTFT, cold {median([float(s) for s in sizes]):.0f}-token system prompt (ms)",
        num(lm_cold, ".0f", 1000),
        f"{num(ll_cold, '.0f', 1000)} {short(ll)}" if ll else "n/a",
        num(r, ".3f"),
        "<= 1.1 x llama-server",
        at_most(r, 1.1),
    )
    lm_warm = ttft(second[lm])
    warms = {k: ttft(second[k]) for k in names}
    ll = faster(warms, names, most=False)
    ll_warm = warms[ll] if ll else math.nan
    lm_cached = cached(second[lm])
    r = ratio(lm_warm, ll_warm)
    goal_ratio = at_most(r, 1.2)
    figures.add(
        "TTFT, 2nd request sharing the prefix (ms)",
        f"{num(lm_warm, '.0f', 1000)} (cached {lm_cached})",
        f"{num(ll_warm, '.0f', 1000)} (cached {cached(second[ll])}) {short(ll)}" if ll else "n/a",
        num(r, ".3f"),
        "<= 1.2 x llama-server, cached >= 1400",
        False if (lm_cached or 0) < 1400 else goal_ratio,
    )
    lm_after = ttft(after[lm])
    r = ratio(lm_after, lm_warm)
    figures.add(
        "TTFT of that request after a restart (ms)",
        f"{num(lm_after, '.0f', 1000)} (cached {cached(after[lm])})",
        f"{num(ttft(after[ll]), '.0f', 1000)} (full prefill) {short(ll)}" if ll else "n/a",
        f"{num(r, '.2f')} x warm",
        "<= 3 x lmsp's warm",
        at_most(r, 3.0),
    )


# -- resume after kill -9 ------------------------------------------------------------------


#: a prompt the bundled model answers greedily with more than 1,200 tokens (a plain "write
#: a long story" ends after ~600)
LONG = (
    "Write a long story about a cartographer mapping an island that moves."
    " Make it very long, with many chapters. Chapter 1:"
)


def resume_body(plan: Plan) -> dict[str, Any]:
    """A greedy background stream of :data:`LONG` that resumes after a crash, long enough
    to be cut ``plan.resume_at`` tokens in."""
    return {
        "model": MODEL,
        "input": LONG,
        "max_output_tokens": plan.resume_at * 3 // 2,
        "temperature": 0,
        "background": True,
        "stream": True,
        "on_restart": "resume",
    }


def resume_once(
    server: Server, plan: Plan, count: Count, standby: Server | None = None
) -> tuple[int, float, float]:
    """One task followed to ``plan.resume_at`` tokens, ``kill -9``, relaunch: (tokens seen
    before the kill, seconds to healthy, seconds to the next text; NaN if none came).
    With ``standby`` (an ``lmsp serve --standby`` waiting on the same directory and
    port), nothing is relaunched: the seconds count from the kill."""
    with server.client(timeout=900) as http:
        body = resume_body(plan)
        text = ""
        response_id = ""
        seen = 0
        with http.stream("POST", "/v1/responses", json=body) as answer:
            for event, data in sse_lines(answer):
                payload = json.loads(data)
                if event == "response.created":
                    response_id = payload["response"]["id"]
                elif event == "response.output_text.delta":
                    text += payload["delta"]
                    seen = count(text)
                    if seen >= plan.resume_at:
                        break
                elif event in TERMINAL:
                    break
    killed = time.perf_counter()
    server.kill()
    if seen < plan.resume_at:
        print(f"  the task ended after {seen} tokens; nothing to resume")
        (standby or server).start()
        return seen, math.nan, math.nan
    # the last event committed before the kill (a little past what the stream showed)
    with contextlib.closing(open_db(server.data_dir)) as conn:
        last = conn.execute(
            "SELECT last_sequence_number FROM tasks WHERE response_id = ?", (response_id,)
        ).fetchone()[0]
    launched = killed
    if standby is None:
        launched = time.perf_counter()
        server.launch()
    else:
        server = standby
    server.wait_healthy()
    healthy = time.perf_counter() - launched
    nxt = math.nan
    with server.client(timeout=900) as http:
        path = f"/v1/responses/{response_id}?stream=true&starting_after={last}"
        with http.stream("GET", path) as answer:
            for event, _ in sse_lines(answer):
                if event == "response.output_text.delta":
                    nxt = time.perf_counter() - launched
                    break
                if event in TERMINAL:
                    break
        http.post(f"/v1/responses/{response_id}/cancel")
    return seen, healthy, nxt


def bench_resume(
    work: Path, env: dict[str, str], plan: Plan, figures: Figures, count: Count
) -> None:
    """``kill -9`` a task ``plan.resume_at`` tokens in; relaunch; time to its next token.
    Each repetition has a data directory of its own, so no state an earlier one saved
    serves it."""
    runs: list[tuple[int, float, float]] = []
    for rep in range(plan.reps):
        server = Server(work / f"resume-data-{rep}", env=env).start()
        try:
            runs.append(resume_once(server, plan, count))
        finally:
            server.stop()
    done = [r for r in runs if not math.isnan(r[1])]
    seen = median([float(r[0]) for r in done]) if done else math.nan
    healthy = median([r[1] for r in done])
    nxt = median([r[2] for r in done])
    print(
        f"\nresume after kill -9 at ~{num(seen, '.0f')} tokens, median of {len(done)}:"
        f" relaunch to healthy {num(healthy, '.2f')} s, to the next token {num(nxt, '.2f')} s"
        + (f" ({len(runs) - len(done)} ended early)" if len(done) < len(runs) else "")
    )
    figures.add(
        f"resume after kill -9, ~{num(seen, '.0f')} tokens in (s)",
        f"{num(nxt, '.2f')} (healthy {num(healthy, '.2f')})",
        "n/a (no durable tasks)",
        "",
        "<= 1 s",
        at_most(nxt, 1.0),
    )


# -- creates while streams generate --------------------------------------------------------


def end_streams(stop: threading.Event, server: Server, streams: list[threading.Thread]) -> None:
    """Stop the streams of a load: the server is killed (its queue is long by then)."""
    stop.set()
    server.kill()
    for t in streams:
        t.join(timeout=60)


def bench_creates(server: Server, plan: Plan, figures: Figures) -> None:
    """``plan.creators`` clients create background responses while ``plan.streams``
    streams generate, and ``/healthz`` is probed one request at a time meanwhile; the
    creators and the prober run in processes of their own. The server is killed at the
    end (its queue is long by then)."""
    lm = lmsp_side(server)
    stop = threading.Event()
    streamed: list[Stream] = []

    def generate(i: int) -> None:
        with lm.client() as http:
            while not stop.is_set():
                streamed.append(
                    lm.stream(
                        http, messages_for(SUBJECTS[i % len(SUBJECTS)]), plan.stream_tokens * 4
                    )
                )

    streams = [
        threading.Thread(target=generate, args=(i,), daemon=True) for i in range(plan.streams)
    ]
    body = {"model": MODEL, "input": "durable hello", "background": True, "max_output_tokens": 8}
    with processes(2) as pool:
        for t in streams:
            t.start()
        start_at = time.time() + 3.0  # the streams are running by then
        steady = pool.submit(
            creates_process,
            lm.url,
            lm.headers,
            body,
            plan.steady_clients,
            start_at,
            plan.create_seconds,
            plan.steady_rate,
        )
        steady_latencies, steady_errors = steady.result()
        start_at = time.time() + 1.0
        creating = pool.submit(
            creates_process, lm.url, lm.headers, body, plan.creators, start_at, plan.create_seconds
        )
        probing = pool.submit(
            probe_process, lm.url + lm.health, start_at, plan.create_seconds, 0.02
        )
        latencies, errors = creating.result()
        probes = probing.result()
    end_streams(stop, server, streams)
    s99 = percentile(steady_latencies, 0.99)
    s50 = percentile(steady_latencies, 0.5)
    print(
        f"\n{plan.steady_rate:.0f} durable creates a second from {plan.steady_clients} clients"
        f" for {plan.create_seconds:.0f} s while {plan.streams} streams generate:"
        f" {len(steady_latencies)} answered, p50 {num(s50, '.1f', 1000)}"
        f" ms, p99 {num(s99, '.1f', 1000)} ms, {len(steady_errors)} errors"
        + (f" ({steady_errors[:2]})" if steady_errors else "")
    )
    figures.add(
        f"{plan.steady_rate:.0f} creates/s from {plan.steady_clients} clients during"
        f" {plan.streams} streams: p99 ms (errors)",
        f"{num(s99, '.0f', 1000)} ({len(steady_errors)})",
        "n/a (no durable creates)",
        "",
        "p99 <= 50 ms, 0 errors",
        None if math.isnan(s99) else s99 <= 0.050 and not steady_errors,
    )
    done = len(latencies)
    p50 = percentile(latencies, 0.5)
    p99 = percentile(latencies, 0.99)
    generating = [s for s in streamed if s.tokens and not s.error]
    print(
        f"\n{plan.creators} concurrent durable creates for {plan.create_seconds:.0f} s while"
        f" {plan.streams} streams generate: {done / plan.create_seconds:.0f}/s,"
        f" p50 {num(p50, '.1f', 1000)} ms, p99 {num(p99, '.1f', 1000)} ms, {len(errors)} errors"
        + (f" ({errors[:2]})" if errors else "")
        + f"; {len(generating)} streams finished meanwhile"
    )
    print(f"  /healthz meanwhile: {probes.summary()}")
    figures.add(
        f"peak creates/s, {plan.creators} clients during {plan.streams} streams (p99 ms)",
        f"{done / plan.create_seconds:.0f}/s (p99 {num(p99, '.0f', 1000)}, {len(errors)} errors)",
        "n/a (no durable creates)",
        "",
        ">= 250/s, 0 errors",
        None if not done else done / plan.create_seconds >= 250 and not errors,
    )
    health99 = probes.p(0.99)
    figures.add(
        "/healthz p99 meanwhile (ms)",
        f"{num(health99, '.1f', 1000)} ({probes.errors} errors)",
        "",
        "",
        "<= 20 ms",
        None if math.isnan(health99) else health99 <= 0.020 and not probes.errors,
    )


# -- an engine crash while streams generate ------------------------------------------------


def engine_pid(server: Server, model: str = MODEL) -> int | None:
    """The process id of ``model``'s engine, ``None`` while it has none."""
    with server.client(timeout=30) as http:
        engines = http.get("/v1/service/activity").json().get("engines") or []
    pids = [e.get("pid") for e in engines if e.get("model") == model]
    return int(pids[0]) if pids and pids[0] else None


def bench_engine_kill(server: Server, plan: Plan, figures: Figures) -> None:
    """``plan.streams`` streams generate; durable creates (a process of their own, fewer
    clients than the creates row: the API, not a flood) and ``/healthz`` probes run;
    2 s in the engine process gets ``kill -9``. The API's p99 over the whole window,
    errors, and how long until the engine answered again."""
    lm = lmsp_side(server)
    stop = threading.Event()

    def generate(i: int) -> None:
        with lm.client() as http:
            while not stop.is_set():
                lm.stream(http, messages_for(SUBJECTS[i % len(SUBJECTS)]), plan.stream_tokens)

    streams = [
        threading.Thread(target=generate, args=(i,), daemon=True) for i in range(plan.streams)
    ]
    body = {"model": MODEL, "input": "durable hello", "background": True, "max_output_tokens": 4}
    seconds = max(6.0, plan.create_seconds)
    pid = engine_pid(server)
    back = math.nan
    with processes(2) as pool:
        for t in streams:
            t.start()
        start_at = time.time() + 3.0
        creating = pool.submit(creates_process, lm.url, lm.headers, body, 8, start_at, seconds)
        probing = pool.submit(probe_process, lm.url + lm.health, start_at, seconds, 0.02)
        time.sleep(max(0.0, start_at + 2.0 - time.time()))
        killed_at = time.perf_counter()
        if pid is not None:
            os.kill(pid, 9)
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            now = engine_pid(server)
            if now is not None and now != pid:
                back = time.perf_counter() - killed_at
                break
            time.sleep(0.05)
        latencies, errors = creating.result()
        probes = probing.result()
    end_streams(stop, server, streams)
    p99 = percentile(latencies, 0.99)
    health99 = probes.p(0.99)
    print(
        f"\nkill -9 of the engine (pid {pid}) while {plan.streams} streams generate:"
        f" a new engine ready after {num(back, '.2f')} s; durable creates meanwhile"
        f" (8 clients, {seconds:.0f} s): p99 {num(p99, '.1f', 1000)} ms, {len(errors)} errors"
        + (f" ({errors[:2]})" if errors else "")
        + f"; /healthz: {probes.summary()}"
    )
    figures.add(
        "engine kill -9 during 8 streams: API p99 ms (errors)",
        f"creates {num(p99, '.0f', 1000)} ({len(errors)}),"
        f" /healthz {num(health99, '.0f', 1000)} ({probes.errors})",
        "n/a (one process)",
        "",
        "p99 <= 50 ms, 0 errors",
        None
        if math.isnan(p99) or math.isnan(health99)
        else max(p99, health99) <= 0.050 and not errors and not probes.errors,
    )


# -- exact mode -------------------------------------------------------------------------------


def bench_exact(server: Server, plan: Plan, figures: Figures, fast: float) -> None:
    """8 streams aggregate on a server with ``LMSP_EXACT=1``, against ``fast``."""
    lm = lmsp_side(server)
    with lm.client() as http:
        lm.stream(http, messages_for(SUBJECTS[7]), 4)  # loads the model
    rates = [concurrent(lm, plan.streams, plan.stream_tokens).rate for _ in range(plan.reps)]
    exact = median(rates)
    r = ratio(exact, fast)
    print(
        f"\nLMSP_EXACT=1: {plan.streams} streams x {plan.stream_tokens} tokens aggregate"
        f" {num(exact)} tok/s against {num(fast)} tok/s in the fast default ({num(r, '.2f')})"
    )
    figures.add(
        f"LMSP_EXACT=1, {plan.streams} streams aggregate (tok/s)",
        f"{num(exact)} (fast {num(fast)})",
        "",
        num(r, ".3f"),
        ">= 0.75 x the fast mode",
        at_least(r, 0.75),
    )


# -- the run -------------------------------------------------------------------------------


def lmsp_env() -> dict[str, str]:
    """lmsp's settings for the comparison: ``LMSP_PARALLEL`` sequences (8, like
    llama-server's slots) of ``LMSP_N_CTX`` tokens each, unless the environment says
    otherwise."""
    return {
        "LMSP_THREADS": str(threads()),
        "LMSP_MAX_QUEUE": "1000000",
        "LMSP_DEFAULT_ON_RESTART": "fail",
        "LMSP_PARALLEL": os.environ.get("LMSP_PARALLEL") or str(Plan.streams),
        "LMSP_N_CTX": os.environ.get("LMSP_N_CTX") or str(N_CTX),
    }


def start_llama_server(
    work: Path, n_ctx: int, plan: Plan, flags: tuple[str, ...]
) -> llama_server.LlamaServer | None:
    """A running llama-server with ``flags``, built first if it is missing; ``None`` with a
    clear message when it cannot be built or started (the lmsp rows still run)."""
    from lmsp.bootstrap import bundled_model_path

    try:
        binary = llama_server.ensure_built()
    except Exception as exc:
        print(
            f"\n*** llama-server could not be built: {exc}\n"
            "*** the comparison runs lmsp alone; the rows that need llama-server say n/a."
            "\n*** build it by hand with: .venv/bin/python bench/llama_server.py",
            flush=True,
        )
        return None
    server = llama_server.LlamaServer(
        binary,
        bundled_model_path(),
        threads=threads(),
        parallel=plan.streams,
        n_ctx=n_ctx,
        log=work / f"llama-server{'-'.join(('', *flags)).replace('--', '-')}.log",
        flags=flags,
    )
    try:
        return server.start()
    except Exception as exc:
        shown = " ".join(flags) or "its default flags"
        print(
            f"\n*** llama-server ({binary}) with {shown} did not start: {exc}\n"
            "*** the rows go on without it (with neither, they say n/a). With its defaults"
            " llama.cpp repacks the weights for the CPU's extra buffer types; on CPUs with"
            " AMX that matmul crashes (exit -11).",
            flush=True,
        )
        return None


def wanted(part: str) -> bool:
    """Whether ``LMSP_BENCH_PARTS`` (unset: every part) names ``part``."""
    parts = {p.strip() for p in os.environ.get("LMSP_BENCH_PARTS", "").split(",") if p.strip()}
    return not parts or part in parts


def run(work: Path, table: Callable[[str, list[str], list[list[str]]], None]) -> None:
    """All the side-by-side benchmarks; ``table`` prints the summary."""
    from llama_cpp import Llama

    from lmsp.bootstrap import bundled_model_path

    plan = Plan.pick()
    env = lmsp_env()
    n_ctx = int(env["LMSP_N_CTX"])
    vocab = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False))

    figures = Figures()
    configs = {
        "llama-server (defaults)": llama_server.DEFAULT_FLAGS,
        "llama-server (--no-repack -fa on)": llama_server.FAST_FLAGS,
    }
    ll_servers: dict[str, llama_server.LlamaServer] = {}
    for name, flags in configs.items():
        started = start_llama_server(work, n_ctx, plan, flags)
        if started is not None:
            ll_servers[name] = started
    binary = next(iter(ll_servers.values())).args[0] if ll_servers else "not available"
    print(
        f"\nlmsp vs llama-server ({binary}): {MODEL}, {threads()} threads, n_ctx {n_ctx} a"
        f" sequence, llama-server -np {plan.streams} with its defaults and with --no-repack"
        f" -fa on, lmsp LMSP_PARALLEL={env['LMSP_PARALLEL']}"
        + (" [QUICK smoke run]" if quick() else ""),
        flush=True,
    )
    lm_server = Server(work / "lmsp-data", env=env).start()
    servers = [lm_server]
    busy = [busy_cpus()]  # others' load, both servers idle
    try:
        lm = lmsp_side(lm_server)
        lls = [llama_side(server, name) for name, server in ll_servers.items()]
        for side in [lm, *lls]:
            with side.client() as http:  # warm-up: lmsp loads its model on first use
                side.stream(http, messages_for(SUBJECTS[7]), 4)
        fast = bench_generation(lm, lls, plan, figures) if wanted("generation") else math.nan

        def restart() -> list[Side]:
            lm_server.stop()
            lm_server.start()
            for server in ll_servers.values():
                server.stop()
                server.start()
            return [
                lmsp_side(lm_server),
                *(llama_side(server, name) for name, server in ll_servers.items()),
            ]

        if wanted("prefix"):
            bench_prefix([lm, *lls], plan, figures, count, restart)
        busy.append(busy_cpus())
        for server in ll_servers.values():
            server.stop()  # from here on lmsp only: leave it the machine
        lm_server.stop()
        if wanted("exact"):
            exact = Server(work / "exact-data", env=dict(env, LMSP_EXACT="1")).start()
            servers.append(exact)
            bench_exact(exact, plan, figures, fast)
            exact.stop()
        if wanted("creates"):
            creating = Server(work / "creates-data", env=env).start()
            servers.append(creating)
            bench_creates(creating, plan, figures)
        if wanted("kill"):
            crashing = Server(work / "crash-data", env=env).start()
            servers.append(crashing)
            with crashing.client() as http:  # an engine to kill
                lmsp_side(crashing).stream(http, messages_for(SUBJECTS[7]), 4)
            bench_engine_kill(crashing, plan, figures)
        if wanted("resume"):
            bench_resume(work, dict(env, LMSP_DEFAULT_ON_RESTART="resume"), plan, figures, count)
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                server.kill()
        for ll_server in ll_servers.values():
            ll_server.stop()
        vocab.close()
    print(
        f"\nother load on the machine, both servers idle: {busy[0]:.2f} CPUs before,"
        f" {busy[1] if len(busy) > 1 else math.nan:.2f} after the side-by-side part"
    )
    if max(busy) > 0.25:
        print(
            "*** the machine was busy with other work: llama.cpp's decode slows down"
            " several-fold beside even one busy process, so these figures are not reliable"
        )
    table(
        "summary: lmsp vs llama-server" + (" (QUICK smoke run: not figures)" if quick() else ""),
        ["benchmark", "lmsp", "llama-server (the faster)", "ratio", "goal", "verdict"],
        figures.rows,
    )
