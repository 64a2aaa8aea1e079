"""(l) model pulls (issue 26): ``POST /v1/models/pull`` from a stand-in hub on loopback
against ``curl`` of the same file, and what a pull costs while 8 streams generate.

Throughput: the stand-in (tests/hub_standin.py, the kernel's ``sendfile``) serves the
bundled GGUF with one metadata byte changed (a new blob each time); ``curl -o`` fetches
it to a file, and lmsp pulls it as a task: the hub's file list, the download with every
byte hashed (SHA-256) and synced twice a second with a progress event, the check against
the hub's SHA-256 and the registration, from the ``POST`` to the task's end. Goal: lmsp
≥ 0.9 x curl. Runs alternate; the median of each is reported. Beside plain curl, curl
followed by ``sha256sum`` and ``sync`` (the same guarantees by hand); and all three again
through a 100 MiB/s link (the stand-in throttled), where the network bounds a download.

Beside generation: 8 clients stream answers of the bundled model without pause; for the
same length of time, once alone and once while a pull runs (at full speed), the
tokens/s of the 8 streams and the CPU seconds the lmsp API process (where the
downloader runs; the engine has a process of its own) spent.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench.clients import sse_lines
from tests.helpers import Server
from tests.hub_standin import Hub, HubFile, serve, sha256_of, variant_gguf

from lmsp.bootstrap import bundled_model_path

REPO = "bench/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m-instruct"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pull_once(http: httpx.Client, model_id: str) -> float:
    began = time.perf_counter()
    answer = http.post("/v1/models/pull", json={"from": f"hf.co/{REPO}:Q4_1", "id": model_id})
    answer.raise_for_status()
    task_id = answer.json()["task"]["id"]
    # the task's events as they are committed (a stream that ends with the task): its
    # end is seen when it happens, without a poll's granularity or its requests' CPU
    with http.stream("GET", f"/v1/tasks/{task_id}/events") as events:
        for _ in sse_lines(events):
            pass
    took = time.perf_counter() - began
    task = http.get(f"/v1/tasks/{task_id}").json()
    assert task["status"] == "completed", task
    http.delete(f"/v1/models/{model_id}").raise_for_status()  # the next pull fetches again
    return took


def curl_once(url: str, target: Path, durable: bool = False) -> float:
    """``curl -o``; ``durable``: then ``sha256sum`` of the file and ``sync`` of it, what
    a user does by hand for what a pull guarantees (a checked file on disk)."""
    began = time.perf_counter()
    subprocess.run(["curl", "-sSf", "-o", str(target), url], check=True)
    if durable:
        subprocess.run(["sha256sum", str(target)], check=True, capture_output=True)
        subprocess.run(["sync", str(target)], check=True)
    took = time.perf_counter() - began
    target.unlink()
    return took


#: a fast internet link, for the run where the network is what bounds a download
LINK = 100 * (1 << 20)


class Streams:
    """``n`` clients streaming answers of the bundled model until stopped; the tokens
    are the server's own count (``lmsp_generated_tokens`` on ``/metrics``: a delta
    event carries all the text of a flush, not one token)."""

    def __init__(self, url: str, token: str, n: int) -> None:
        self.stop = threading.Event()
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        self.threads = [
            threading.Thread(target=self.run, args=(url, token, i), daemon=True) for i in range(n)
        ]

    @property
    def tokens(self) -> float:
        metrics = self.http.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("lmsp_generated_tokens_total")
        )

    def run(self, url: str, token: str, i: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            while not self.stop.is_set():
                body = {
                    "model": MODEL,
                    "input": f"Tell story number {i} about a lighthouse.",
                    "max_output_tokens": 256,
                    "stream": True,
                }
                with http.stream("POST", "/v1/responses", json=body) as answer:
                    for _ in sse_lines(answer):
                        if self.stop.is_set():
                            break

    def __enter__(self) -> Streams:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        self.http.close()


def bench_pull(
    work: Path, reps: int, table: Callable[[str, list[str], list[list[str]]], None]
) -> None:
    source = variant_gguf(bundled_model_path(), work / FILE)
    size = source.stat().st_size
    hub = serve(Hub(REPO, [HubFile(FILE, source, size, sha256_of(source))]))
    server = Server(work / "pull-data", env={"LMSP_HF_ENDPOINT": hub.url}).start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
        mib = size / (1 << 20)
        with server.client(timeout=120) as http:
            rows: list[list[str]] = []
            for link, rate in (("loopback, unthrottled", None), ("a 100 MiB/s link", LINK)):
                hub.rate = rate
                runs: dict[str, list[float]] = {"curl": [], "durable": [], "lmsp": []}
                for rep in range(reps):  # alternated, so a change in load hits all three
                    runs["curl"].append(curl_once(url, work / "curl.gguf"))
                    runs["durable"].append(curl_once(url, work / "curl.gguf", durable=True))
                    runs["lmsp"].append(pull_once(http, f"bench-{rep}"))
                took = {name: statistics.median(times) for name, times in runs.items()}
                if rate is None:
                    pull_s = took["lmsp"]  # at full speed: the window below is 1.5x it
                for name, label in (
                    ("curl", "curl -o (no hashing, no sync)"),
                    ("durable", "curl -o, then sha256sum and sync"),
                    ("lmsp", "lmsp pull (SHA-256, sync, events, register)"),
                ):
                    rows.append(
                        [
                            link,
                            label,
                            f"{took[name]:.2f}",
                            f"{mib / took[name]:.0f}",
                            f"{took['curl'] / took[name]:.2f}",
                        ]
                    )
            hub.rate = None
            table(
                f"(l) model pull: {mib:.0f} MiB from a loopback stand-in hub, median of {reps}",
                ["link", "path", "seconds", "MiB/s", "vs curl"],
                rows,
            )
            http.post("/v1/responses", json={"model": MODEL, "input": "warm up"})
            rows = []
            window = max(3.0, pull_s * 1.5)
            for label, with_pull in (("8 streams alone", False), ("8 streams + a pull", True)):
                with Streams(server.url, server.token, 8) as streams:
                    time.sleep(2.0)  # every stream is generating
                    tokens0, cpu0, began = streams.tokens, cpu_seconds(pid), time.perf_counter()
                    pulled: list[float] = []
                    if with_pull:
                        pulled.append(pull_once(http, "bench-beside"))
                    time.sleep(max(0.0, window - (time.perf_counter() - began)))
                    took = time.perf_counter() - began
                    tokens, cpu = streams.tokens - tokens0, cpu_seconds(pid) - cpu0
                rows.append(
                    [
                        label,
                        f"{tokens / took:.1f}",
                        f"{cpu:.2f}",
                        f"{pulled[0]:.2f}" if pulled else "-",
                    ]
                )
            table(
                f"(l) beside generation: {window:.1f} s windows, the lmsp API process's CPU",
                ["run", "tokens/s (8 streams)", "API CPU s", "pull s"],
                rows,
            )
    finally:
        server.stop()
        hub.close()


def main(argv: list[str] | None = None) -> Any:  # pragma: no cover - by hand
    import tempfile

    from bench.run import table

    with tempfile.TemporaryDirectory(prefix="lmsp-bench-pull-") as work:
        bench_pull(Path(work), 3, table)


if __name__ == "__main__":
    main()
