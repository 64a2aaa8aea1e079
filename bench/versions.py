"""(q) this checkout against an earlier revision: creates/s, 8-stream tokens/s and the API
process's CPU per create, side by side in one run.

    .venv/bin/python bench/versions.py --base REV [--reps 3] [--seconds 8]

A refactoring promises behaviour unchanged and speed no lower; this measures the second
half. The revision ``REV`` is checked out (``git worktree add --detach``) into a temporary
folder and its ``lmsp serve`` runs with this environment's interpreter and libraries, its
own source first on ``PYTHONPATH``; this checkout's runs beside it. Runs alternate (base,
this, base, this …) so the machine's load falls on both alike, and medians are compared:

- creates/s: 16 clients create background responses on the deterministic engine for
  ``--seconds`` (each answered ``202`` after its commit), and the API process's CPU time
  (user + system, from ``/proc``) over the window divided by the creates;
- 8-stream tokens/s: 8 streamed responses of the bundled model at once
  (``LMSP_PARALLEL=8``), output tokens per second of wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import Server

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
TEST_MODEL = "lmsp-test"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def creates(server: Server, concurrency: int, seconds: float) -> tuple[float, float]:
    """Creates per second and the API process's CPU milliseconds per create."""
    body = {"model": TEST_MODEL, "input": "durable hello", "background": True}
    headers = {"Authorization": f"Bearer {server.token}"}
    limits = httpx.Limits(max_connections=concurrency)
    done = 0
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, limits=limits, timeout=60
    ) as http:

        async def worker(stop_at: float) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                answer = await http.post("/v1/responses", json=body)
                if answer.status_code != 202:
                    raise RuntimeError(f"{answer.status_code}: {answer.text}")
                done += 1

        await asyncio.gather(*(worker(time.perf_counter() + 1.0) for _ in range(concurrency)))
        done = 0
        assert server.proc is not None
        cpu0, start = cpu_seconds(server.proc.pid), time.perf_counter()
        await asyncio.gather(*(worker(start + seconds) for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - start, cpu_seconds(server.proc.pid) - cpu0
    return done / wall, 1000 * cpu / max(done, 1)


async def streams(server: Server, n: int, tokens: int) -> float:
    """Output tokens per second of wall time, ``n`` streamed responses at once."""
    body = {
        "model": MODEL,
        "input": "Write a long story about a lighthouse keeper.",
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=600) as http:

        async def one(i: int) -> int:
            made = 0
            async with http.stream("POST", "/v1/responses", json={**body, "seed": i}) as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    if line.startswith("data:") and '"usage"' in line:
                        usage = json.loads(line[5:]).get("response", {}).get("usage")
                        made = int(usage["output_tokens"]) if usage else made
            return made

        await one(0)  # the model loaded
        start = time.perf_counter()
        made = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(made) / (time.perf_counter() - start)


def measure(source: Path, work: Path, args: argparse.Namespace) -> tuple[float, float, float]:
    env = {
        "PYTHONPATH": str(source / "src"),
        "LMSP_TEST_ENGINE_DELAY": "0",
        "LMSP_MAX_QUEUE": "1000000",
        "LMSP_PARALLEL": "8",
    }
    server = Server(work, env=env).start(wait=300)
    try:
        rate, cpu = asyncio.run(creates(server, args.concurrency, args.seconds))
        tokens = asyncio.run(streams(server, 8, args.tokens))
    finally:
        server.stop()
    return rate, cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--base", required=True, help="the earlier revision (e.g. main)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmsp-versions-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
            check=True,
            capture_output=True,
        )
        found: dict[str, list[tuple[float, float, float]]] = {"base": [], "this": []}
        try:
            for rep in range(args.reps):
                for side, source in (("base", base), ("this", ROOT)):
                    figures = measure(source, Path(tmp) / f"{side}-{rep}", args)
                    found[side].append(figures)
                    print(
                        f"  {side} run {rep + 1}: {figures[0]:.1f} creates/s, "
                        f"{figures[1]:.2f} ms CPU/create, {figures[2]:.1f} tokens/s"
                    )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False,
                capture_output=True,
            )
    rows = [
        ("creates/s", 0, True),
        ("API CPU ms per create", 1, False),
        ("tokens/s (8 streams)", 2, True),
    ]
    print(f"\n(q) this checkout against {args.base} (medians of {args.reps})")
    print(f"{'figure':<24}{'base':>10}{'this':>10}{'this/base':>11}")
    for name, i, _higher_better in rows:
        b = statistics.median(f[i] for f in found["base"])
        t = statistics.median(f[i] for f in found["this"])
        print(f"{name:<24}{b:>10.2f}{t:>10.2f}{t / b:>11.3f}")


if __name__ == "__main__":
    main()
