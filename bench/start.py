"""The API process's own start (issue 40): ``lmsp serve`` from exec to ``/healthz`` 200 on
a data directory with a running task to recover.

A template data directory is made once: a real ``lmsp serve`` with one background
``on_restart: resume`` task of the test engine (a long answer, slowly), ``kill -9`` while
it runs. Each repetition copies the template and launches ``lmsp serve`` on the copy, so
every start recovers the same interrupted task (and launches its engine) before it
serves. Printed, medians of ``reps``:

- wall time from the launch to the first ``/healthz`` 200 (polled every 5 ms);
- CPU seconds (user + system) the API process spent by then (``/proc``; its engines'
  processes not counted), steadier than wall time on a shared machine;
- where the wall time went, from the JSON log's timestamps (milliseconds): the recovered
  task's engine ready (``engine.started``: launched once the directory is recovered,
  before the HTTP application's imports), ``service.start`` (those imports done) and
  uvicorn's startup complete (the application's own startup done);
- with bytecode cached as an installed lmsp runs (``PYTHONDONTWRITEBYTECODE`` off, the
  ``.pyc`` files under the work directory, written by the template's server), unless
  ``LMSP_START_SOURCES`` is set (each start compiles lmsp's sources again);
- the load average before and after, and the top import costs of the modules ``lmsp
  serve`` imports before it serves, under ``-X importtime`` in an interpreter of their
  own (a served start's log would mix in its engine's, whose spawned interpreter
  inherits the flag); by top-level package, self time, median of 3.

``LMSP_START_REPS`` sets the repetitions (7; 2 with ``LMSP_BENCH_QUICK``);
``LMSP_START_MODEL=bundled`` makes the task the bundled model's (its engine loads while
the API starts, on the same cores). Alone: ``.venv/bin/python -m bench.start``; in
``bench/run.py``: ``--only start``.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from bench.clients import MODEL, median
from tests.helpers import Server, free_port

Table = Callable[[str, list[str], list[list[str]]], None]
#: the log lines whose time from the launch is reported: the recovered task's engine
#: ready, the directory recovered and the HTTP application imported, uvicorn started
MARKS = ("engine.started", "service.start", "Application startup complete.")


@dataclass
class Start:
    wall: float  # seconds from the launch to /healthz 200
    cpu: float  # user + system seconds of the API process by then
    marks: dict[str, float]  # log line -> seconds from the launch


def make_template(work: Path, env: dict[str, str], model: str) -> Path:
    """A data directory whose one ``on_restart: resume`` task was running at a ``kill -9``."""
    data = work / "template"
    server = Server(data, env=env).start()
    try:
        with server.client(timeout=120) as http:
            body = {
                "model": model,
                "input": "Write a long story about a lighthouse keeper.",
                "background": True,
                "on_restart": "resume",
                "max_output_tokens": 4000,
            }
            answer = http.post("/v1/responses", json=body)
            answer.raise_for_status()
            rid = answer.json()["id"]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # some output committed, still running
                got = http.get(f"/v1/responses/{rid}").json()
                if got["status"] != "queued" and got.get("output"):
                    break
                time.sleep(0.1)
            time.sleep(0.5)
    finally:
        server.kill()
    return data


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_marks(log: Path, launched: float) -> dict[str, float]:
    marks: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        stamp = datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
        at = stamp.timestamp() - launched
        for name in MARKS:
            if name in (record.get("event"), record.get("message")):
                marks.setdefault(name, at)
    return marks


def start_once(template: Path, data: Path, env: dict[str, str], extra: list[str]) -> Start:
    """Launch ``lmsp serve`` on a copy of ``template``; its figures at ``/healthz`` 200."""
    shutil.copytree(template, data)
    port = free_port()
    full = dict(os.environ, **env)
    full.update(
        {
            "LMSP_DATA_DIR": str(data),
            "LMSP_PORT": str(port),
            "LMSP_HOST": "127.0.0.1",
            "LMSP_LOG_FORMAT": "json",
        }
    )
    log = data.parent / f"{data.name}.log"
    url = f"http://127.0.0.1:{port}/healthz"
    with log.open("wb") as out, httpx.Client(timeout=1) as http:
        launched = time.time()
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *extra, "-m", "lmsp", "serve"], env=full, stdout=out, stderr=out
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"lmsp serve exited: {log.read_text()[-2000:]}")
                try:
                    if http.get(url).status_code == 200:
                        wall = time.perf_counter() - began
                        cpu = cpu_seconds(proc.pid)
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.005)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    return Start(wall, cpu, log_marks(log, launched))


#: what ``lmsp serve`` imports before it listens (lmsp.cli.serve's own imports)
SERVE_IMPORTS = (
    "import lmsp.cli, lmsp.logs, lmsp.cluster.startup, uvicorn, lmsp.api.app, lmsp.api.guard"
)


def import_costs(env: dict[str, str], top: int) -> list[tuple[str, float]]:
    """``-X importtime``'s self times of :data:`SERVE_IMPORTS` summed by top-level
    package (``lmsp`` by its subpackage), median of 3 runs, the ``top`` largest, in ms."""
    runs: list[collections.Counter[str]] = []
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", SERVE_IMPORTS],
            env=dict(os.environ, **env),
            capture_output=True,
            text=True,
            check=True,
        )
        costs: collections.Counter[str] = collections.Counter()
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, _, name = line.split(":", 1)[1].split("|")
            parts = name.strip().split(".")
            costs[".".join(parts[:2]) if parts[0] == "lmsp" else parts[0]] += int(own)
        runs.append(costs)
    names = {name for costs in runs for name in costs}
    ms = {name: median([costs[name] / 1000 for costs in runs]) for name in names}
    total = median([sum(costs.values()) / 1000 for costs in runs])
    ranked = sorted(ms.items(), key=lambda item: -item[1])[:top]
    return [("(all)", total), *ranked]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_start(work: Path, reps: int, table: Table) -> None:
    bundled = os.environ.get("LMSP_START_MODEL", "") == "bundled"
    model = MODEL if bundled else "lmsp-test"
    env = {"LMSP_ENABLE_TEST_ENGINE": "1", "LMSP_DEFAULT_ON_RESTART": "resume"}
    if not os.environ.get("LMSP_START_SOURCES"):  # bytecode cached, as an install runs
        env |= {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    if not bundled:
        env |= {"LMSP_TEST_ENGINE_DELAY": "0.05", "LMSP_TEST_ENGINE_LENGTH": "100000"}
    template = make_template(work, env, model)
    before = loadavg()
    runs = [start_once(template, work / f"start-{i}", env, []) for i in range(reps)]
    after = loadavg()

    def row(name: str, values: list[float]) -> list[str]:
        return [name, f"{median(values):.3f}", " ".join(f"{v:.2f}" for v in values)]

    rows = [
        row("to /healthz 200 (s)", [r.wall for r in runs]),
        row("API process CPU, user+sys (s)", [r.cpu for r in runs]),
    ]
    for name in MARKS:
        rows.append(row(f"log: {name} (s)", [r.marks[name] for r in runs if name in r.marks]))
    table(
        f"lmsp serve's start, a {model} task to recover, median of {reps}"
        f"{' (sources compiled each start)' if os.environ.get('LMSP_START_SOURCES') else ''}"
        f" (load average before {before}, after {after})",
        ["measure", "median", "each run"],
        rows,
    )
    costs = import_costs(env, 15)
    table(
        "what lmsp serve imports before it serves, -X importtime, self ms (median of 3)",
        ["package", "ms"],
        [[name, f"{ms:.0f}"] for name, ms in costs],
    )


def main() -> None:
    from bench.compare import quick
    from bench.run import table  # make bench's table, when run alone

    with tempfile.TemporaryDirectory(prefix="lmsp-start-") as work:
        reps = int(os.environ.get("LMSP_START_REPS", "0")) or (2 if quick() else 7)
        bench_start(Path(work), reps, table)


if __name__ == "__main__":
    main()
