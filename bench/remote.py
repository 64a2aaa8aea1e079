"""(s) A remote model against its upstream used directly (docs/remote-engines.md).

    .venv/bin/python bench/run.py --only remote      (a part of ``make bench``)

One ``llama-server`` (built by :mod:`bench.llama_server`) on the bundled GGUF with 8
slots; one ``lmsp serve`` with a remote model on it. Measured, interleaved, median of
``reps``: the aggregate tokens/s of 8 concurrent greedy streams through lmsp (every
event persisted) ÷ the same 8 streams sent to the upstream directly (goal ≥ 0.97), the
time to first text of one stream through lmsp minus the upstream's own (goal ≤ 5 ms;
the median of :data:`FIRSTS` streams a round, the sides alternated), and how long after
lmsp answers a cancel the upstream's slot is free (goal ≤ 100 ms).

Measured twice: with every process on every core (the upstream's threads and lmsp's
compete for the same two cores) and with the upstream on a core of its own and lmsp with
the clients on the others (:func:`layouts`), standing in for what a remote engine is
for: an upstream on a GPU host whose compute does not share the control plane's cores.
Both sides of a row see the same layout.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from bench import llama_server
from bench.clients import Side, median
from bench.compare import (
    SUBJECTS,
    concurrent,
    llama_side,
    lmsp_side,
    messages_for,
    num,
    quick,
    threads,
)
from bench.llama_server import LlamaServer
from tests.helpers import Server

from lmsp.bootstrap import bundled_model_path

MODEL = "remote-bench"
STREAMS = 8
#: single streams timed to their first text, per side and round (the median of all)
FIRSTS = 5


#: the two sides' names, as the figures are keyed
LMSP, DIRECT = "lmsp (remote)", "llama-server direct"


def remote_side(server: Server) -> Side:
    return lmsp_side(server, LMSP, MODEL)


@dataclass(frozen=True)
class Layout:
    """Where the processes run: ``upstream`` the upstream's cores, ``local`` lmsp's and the
    clients' (``None``: every core)."""

    name: str
    upstream: frozenset[int] | None = None
    local: frozenset[int] | None = None

    def threads(self) -> int:
        return threads() if self.upstream is None else len(self.upstream)


def layouts() -> list[Layout]:
    shared = Layout("cores shared")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return [shared]
    apart = Layout("upstream on a core of its own", frozenset(cores[-1:]), frozenset(cores[:-1]))
    return [shared, apart]


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """This process (and what it starts meanwhile) on ``cpus``."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_pair(work: Path, layout: Layout = Layout("cores shared")) -> tuple[LlamaServer, Server]:
    """A ``llama-server`` with :data:`STREAMS` slots on the bundled GGUF and an ``lmsp
    serve`` with :data:`MODEL` a remote model on it (both stopped by the caller)."""
    binary = llama_server.ensure_built()
    upstream = LlamaServer(
        binary,
        bundled_model_path(),
        threads=layout.threads(),
        parallel=STREAMS,
        n_ctx=2048,
        log=work / "llama-server-remote.log",
        extra=("--slots",),
        cpus=layout.upstream,
    ).start()
    server = Server(work / "lmsp-remote", env={"LMSP_PARALLEL": str(STREAMS)})
    try:
        server.start()
        with server.client(timeout=600) as http:
            remote = {"url": upstream.url, "upstream_model": "smollm2", "inflight": STREAMS}
            body = {"id": MODEL, "path": str(bundled_model_path()), "remote": remote}
            added = http.post("/v1/models", json=body)
            added.raise_for_status()
    except BaseException:
        server.stop()
        upstream.stop()
        raise
    return upstream, server


def slot_free_after_cancel(server: Server, upstream: str) -> float:
    """Seconds from lmsp's answer to a cancel until no upstream slot is processing."""
    with server.client(timeout=300) as http:
        body = {
            "model": MODEL,
            "input": messages_for(SUBJECTS[1]),
            "background": True,
            "temperature": 0,
            "max_output_tokens": 2000,
        }
        rid = http.post("/v1/responses", json=body).json()["id"]
        with http.stream("GET", f"/v1/responses/{rid}", params={"stream": "true"}) as stream:
            deltas = 0
            for line in stream.iter_lines():
                deltas += "output_text.delta" in line
                if deltas >= 8:
                    break
        http.post(f"/v1/responses/{rid}/cancel")
        answered = time.perf_counter()
        while time.perf_counter() - answered < 10:
            slots = httpx.get(f"{upstream}/slots", timeout=10).json()
            if not any(s.get("is_processing") for s in slots):
                return time.perf_counter() - answered
            time.sleep(0.002)
    return math.nan


@dataclass
class Figures:
    rate: dict[str, float]
    first: dict[str, float]
    freed: list[float]


def measure(work: Path, layout: Layout, reps: int, tokens: int) -> Figures:
    place = work / layout.name.replace(" ", "-")
    place.mkdir(parents=True, exist_ok=True)
    with pinned(layout.local):
        upstream, server = start_pair(place, layout)
        try:
            return measure_pair(server, upstream, reps, tokens)
        finally:
            server.stop()
            upstream.stop()


def measure_pair(server: Server, upstream: LlamaServer, reps: int, tokens: int) -> Figures:
    lm, ll = remote_side(server), llama_side(upstream, DIRECT)
    for side in (lm, ll):  # the model's engine started, not timed as a first text
        with side.client() as http:
            side.stream(http, messages_for(SUBJECTS[2]), 4)
    rates: dict[str, list[float]] = {lm.name: [], ll.name: []}
    firsts: dict[str, list[float]] = {lm.name: [], ll.name: []}
    for _ in range(reps):
        for _ in range(FIRSTS):  # one stream at a time, the two sides alternated
            for side in (lm, ll):
                with side.client() as http:
                    one = side.stream(http, messages_for(SUBJECTS[0]), 16)
                if one.first is not None:
                    firsts[side.name].append(one.first)
        for side in (lm, ll):
            rates[side.name].append(concurrent(side, STREAMS, tokens).rate)
    freed = [slot_free_after_cancel(server, upstream.url) for _ in range(reps)]
    return Figures(
        rate={k: median(v) for k, v in rates.items()},
        first={k: median(v) if v else math.nan for k, v in firsts.items()},
        freed=freed,
    )


def rows_for(layout: Layout, got: Figures, tokens: int) -> list[list[str]]:
    lm, ll = LMSP, DIRECT
    throughput = got.rate[lm] / got.rate[ll] if got.rate[ll] else math.nan
    overhead = (got.first[lm] - got.first[ll]) * 1000
    return [
        [
            f"{layout.name}: {STREAMS} streams x {tokens} tokens (tok/s)",
            num(got.rate[lm]),
            num(got.rate[ll]),
            num(throughput, ".3f"),
            ">= 0.97",
        ],
        [
            f"{layout.name}: time to first text (ms)",
            num(got.first[lm], ".1f", 1000),
            num(got.first[ll], ".1f", 1000),
            f"+{num(overhead, '.1f')} ms",
            "<= +5 ms",
        ],
        [
            f"{layout.name}: slot free after a cancel (ms)",
            num(median(got.freed), ".1f", 1000),
            "",
            "",
            "<= 100 ms",
        ],
    ]


def bench_remote(work: Path, table: Callable[[str, list[str], list[list[str]]], None]) -> None:
    reps = 1 if quick() else 3
    tokens = 24 if quick() else 128
    rows: list[list[str]] = []
    for layout in layouts():
        rows += rows_for(layout, measure(work, layout, reps, tokens), tokens)
    table(
        "(s) a remote model (lmsp in front of llama-server) against llama-server directly",
        ["what", "lmsp remote", "upstream direct", "ratio", "goal"],
        rows,
    )
