"""The clients the llama-server comparison drives both servers with (bench/compare.py).

One streamed request to either server (lmsp's Responses API, llama-server's Chat
Completions), the health prober, resident-memory sampling of a server's process tree,
and the create load, which runs in a process of its own: the benchmark's own Python
(eight SSE readers, 64 async clients) must not inflate the latencies it measures
through its GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


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

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def sse_lines(answer: httpx.Response) -> Iterator[tuple[str, str]]:
    event = ""
    for line in answer.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, line[5:].strip()
            event = ""


def lmsp_stream(
    http: httpx.Client,
    messages: list[dict[str, str]],
    max_tokens: int,
    model: str = MODEL,
    **extra: Any,
) -> Stream:
    body: dict[str, Any] = {
        "model": model,
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
                    if event != "response.completed" and final.get("status") == "failed":
                        out.error = str(final.get("error"))
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


@dataclass
class Side:
    """One server under test: how to stream from it, probe it, and find its process."""

    name: str
    url: str
    headers: dict[str, str]
    stream: Callable[..., Stream]
    health: str
    pid: Callable[[], int]

    def client(self, timeout: float = 900) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)


# -- memory --------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # the command name may hold spaces and parentheses: split after the last ')'
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_rss(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants, bytes: a server that runs its
    engine in a child process is measured whole."""
    tree = _children()
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(tree.get(p, []))
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


class RssPeak:
    """The highest resident memory of a process tree while the ``with`` body runs,
    sampled every ``every`` seconds (and once at each end)."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid = pid
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, tree_rss(self.pid))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> RssPeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def busy_cpus(seconds: float = 1.0) -> float:
    """CPUs' worth of work the whole machine did over ``seconds`` (from ``/proc/stat``),
    taken while the servers under test sit idle: what others run. A 2-thread llama.cpp
    decode runs ~10x slower beside one busy process (its threads wait for each other at
    every barrier), so a figure taken on a busy machine says little."""

    busy0, total0 = machine_ticks()
    time.sleep(seconds)
    busy1, total1 = machine_ticks()
    cpus = os.cpu_count() or 1
    return cpus * (busy1 - busy0) / max(1, total1 - total0)


def machine_ticks() -> tuple[int, int]:
    """The whole machine's busy and total CPU ticks so far (``/proc/stat``; idle and
    iowait are not busy)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


# -- health probes ---------------------------------------------------------------------------


@dataclass
class Probes:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)

    def summary(self) -> str:
        return (
            f"p50 {self.p(0.5) * 1000:.1f} ms, p99 {self.p(0.99) * 1000:.1f} ms"
            f" ({len(self.latencies)} probes, {self.errors} errors)"
        )


def probe_loop(url: str, stop: Callable[[], bool], every: float, probes: Probes) -> None:
    """Polls ``url`` one request at a time until ``stop()``; ``every`` seconds apart."""
    with httpx.Client(timeout=30) as http:
        while not stop():
            t0 = time.perf_counter()
            try:
                ok = http.get(url).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                probes.latencies.append(time.perf_counter() - t0)
            else:
                probes.errors += 1
            time.sleep(every)


class Prober:
    """Polls a health route from its own thread while work runs (the concurrent-streams
    figure; the create benchmark probes from its own process, see :func:`probe_process`)."""

    def __init__(self, url: str, every: float = 0.02) -> None:
        self.url = url
        self.every = every
        self.probes = Probes()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=probe_loop, args=(url, self._stop.is_set, every, self.probes), daemon=True
        )

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the create load, in processes of its own ------------------------------------------------


def _wait_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def probe_process(url: str, start_at: float, seconds: float, every: float) -> Probes:
    """In a child process: probe ``url`` from wall time ``start_at`` for ``seconds``."""
    _wait_until(start_at)
    stop_at = time.perf_counter() + seconds
    probes = Probes()
    probe_loop(url, lambda: time.perf_counter() >= stop_at, every, probes)
    return probes


class KeptAlive:
    """One kept-alive HTTP/1.1 connection that sends the same POST again and again: the
    request's bytes made once, the answer read by its ``Content-Length`` or its chunks. A load
    generator's client, not a general one: a create costs it tens of microseconds of
    CPU where ``httpx`` spends about 6 ms (measured on this project's two cores, where
    the client's CPU is taken from the server's), so what a creates benchmark measures
    is the server."""

    def __init__(self, url: str, path: str, headers: dict[str, str], body: dict[str, Any]):
        parsed = httpx.URL(url)
        self.host, self.port = parsed.host, parsed.port or 80
        data = json.dumps(body).encode()
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + data
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def open(self) -> None:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)

    async def send(self, keep: int = 1 << 16) -> tuple[int, bytes]:
        """The status and body of one more answer — of a chunked one (a stream), its last
        ``keep`` bytes — (``OSError`` or ``asyncio.IncompleteReadError`` when the
        connection broke: it is dropped)."""
        await self.open()
        assert self._streams is not None
        reader, writer = self._streams
        try:
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            fields = dict(
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
            )
            if fields.get(b"transfer-encoding") != b"chunked":
                return status, await reader.readexactly(int(fields.get(b"content-length", 0)))
            tail = b""
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                tail = (tail + (await reader.readexactly(size + 2))[:-2])[-keep:]
            await reader.readuntil(b"\r\n")  # the end of the last chunk's (empty) trailer
            return status, tail
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


def creates_process(
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    clients: int,
    start_at: float,
    seconds: float,
    rate: float = 0.0,
) -> tuple[list[float], list[str]]:
    """In a child process: ``clients`` concurrent clients create background responses
    (each answered ``202`` after its commit) from wall time ``start_at`` for ``seconds``;
    the latencies of the successful creates and the errors. Each client creates again
    as soon as it is answered, or with ``rate`` (creates a second, all clients
    together) at fixed times, each latency counted from the time its create was due
    (a late answer delays the next create: that wait is counted too). Each client is a
    :class:`KeptAlive` connection."""

    async def main() -> tuple[list[float], list[str]]:
        latencies: list[float] = []
        errors: list[str] = []
        conns = [KeptAlive(url, "/v1/responses", headers, body) for _ in range(clients)]
        # every connection open first, so the window measures creates, not their setup
        await asyncio.gather(*(c.open() for c in conns), return_exceptions=True)
        await asyncio.sleep(max(0.0, start_at - time.time()))

        async def worker(conn: KeptAlive, stop_at: float, first: float) -> None:
            due = first
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                if rate > 0:
                    await asyncio.sleep(max(0.0, due - t0))
                    t0, due = due, due + clients / rate
                try:
                    status, answer = await conn.send()
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    errors.append(repr(exc))
                    continue
                if status == 202:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors.append(f"{status}: {answer[:120]!r}")

        began = time.perf_counter()
        stop_at = began + seconds
        offsets = [i / rate if rate > 0 else 0.0 for i in range(clients)]
        try:
            await asyncio.gather(
                *(worker(c, stop_at, began + o) for c, o in zip(conns, offsets, strict=True))
            )
        finally:
            for conn in conns:
                conn.close()
        return latencies, errors

    return asyncio.run(main())


@contextlib.contextmanager
def processes(n: int) -> Iterator[ProcessPoolExecutor]:
    """``n`` fresh worker processes (spawned: nothing of this process's threads or
    sockets is inherited)."""
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        # start them now: spawning imports httpx, which must not eat the measured window
        warm: list[Future[None]] = [pool.submit(time.sleep, 0.01) for _ in range(n)]
        for f in warm:
            f.result()
        yield pool
