"""Profile both processes of lmsp — the API process and the model's engine process —
with py-spy under one of four loads:

- ``streams`` (the default): 8 streams generate (the 8 x 128 benchmark's load, repeated);
- ``creates``: 64 clients create durable responses as fast as they are answered while
  8 streams generate (the peak-creates benchmark's load);
- ``remote``: 8 streams on a remote model whose upstream is a ``llama-server`` with 8
  slots (bench/remote.py's pair), the API process and the remote engine recorded;
- ``resume``: a task is killed with its server ~1,000 tokens in, and the relaunched
  server is recorded from its first instant (``py-spy record --subprocesses``) until
  the task's next text arrives (the resume benchmark's case);
- ``ceiling``: the control plane's peak (bench/ceiling.py's creates): 64 clients create
  durable responses as fast as they are answered, the test engine at full speed (no
  model cost), ``LMSP_PARALLEL=64``;
- ``prefix``: the warm shared-prefix case of the comparison: after one request with a
  ~1,500-token system prompt, requests sharing it, each with a question of its own (the
  prefix read from the cache, the question evaluated), one after another.

    .venv/bin/python bench/pyspy.py [--load streams|creates|resume|remote|ceiling|prefix]
        [--streams 8] [--svg] [--seconds 20] [--out pyspy] [--exact] [--gil]

``--streams``: how many streams the ``streams`` and ``creates`` loads keep generating
(the comparison's 8 by default; 1 for the one-stream row).

py-spy (a dev dependency) samples each process from outside, at 100 Hz, idle threads
left out (``llama_decode`` shows as the Python frame that calls it, ``LlamaContext.decode``);
the collapsed stacks go to ``OUT-api.txt`` and ``OUT-engine.txt`` (``--svg``: flame
graphs too, ``OUT-*.svg``) and a summary is printed: for each process its threads'
shares of the samples and the functions holding the most, inclusive (a frame anywhere on
the stack) and by the frame the samples were taken in (self). ``--gil``: only the
samples of the thread holding the interpreter's lock (what one process's Python can do
at a time: the bound of a control plane whose threads take turns at it).
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import compare  # noqa: E402
from bench.clients import Side, creates_process  # noqa: E402
from tests.helpers import Server  # noqa: E402


def record(
    pid: int,
    seconds: float,
    out: Path,
    native: bool,
    children: bool = False,
    fmt: str = "raw",
    gil: bool = False,
) -> subprocess.Popen[bytes]:
    py_spy = Path(sys.executable).with_name("py-spy")
    command = [str(py_spy), "record", "--pid", str(pid), "--duration", str(int(seconds))]
    command += ["--rate", "100", "--format", fmt, "--output", str(out), "--nonblocking"]
    if native:
        command.append("--native")
    if children:  # and the processes it starts (the engine), each stack under its process
        command.append("--subprocesses")
    else:  # each stack under its thread's name
        command.append("--threads")
    if gil:  # only the samples of the thread holding the interpreter's lock
        command.append("--gil")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def summary(stacks: Path, top: int = 12) -> str:
    """The heaviest functions of a collapsed-stack file (``frame;frame;… count``)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        first, *rest = stack.split(";")
        # the thread's name (``thread (TID): NAME``), a runner's workers as one
        threads[re.sub(r"-\d+$", "-N", first.partition(": ")[2] or first)] += n
        frames = [f.split(" (")[0] for f in rest]
        for frame in set(frames):
            inclusive[frame] += n
        if frames:
            own[frames[-1]] += n
    if not total:
        return "  (no samples: the process was idle)"
    lines = [f"  {total} samples (busy threads only)", "  threads:"]
    lines += [f"    {n / total:6.1%}  {t}" for t, n in threads.most_common(6)]
    lines += ["  inclusive:"]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
    lines += ["  self:"]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def split_processes(stacks: Path, api: Path, engine: Path) -> None:
    """Split ``py-spy record --subprocesses`` stacks (each starts with its process's
    frames) into the API process's and the engine process's, dropping those frames."""
    by_process: dict[str, list[str]] = {}
    for line in stacks.read_text().splitlines():
        # process N:"its command line"; (which may hold a ';'), a child's under its parent's
        process, rest = "", line
        while rest.startswith("process ") and '";' in rest:
            process, _, rest = rest.partition('";')
        if process:
            by_process.setdefault(process, []).append("process;" + rest)
    for process, lines in by_process.items():
        target = engine if "multiprocessing" in process else api
        with target.open("a") as out:
            out.write("\n".join(lines) + "\n")


def token_counter() -> compare.Count:
    """The bundled model's token count of a text (its vocabulary only)."""
    from llama_cpp import Llama

    from lmsp.bootstrap import bundled_model_path

    vocab = Llama(str(bundled_model_path()), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    return count


def profile_resume(work: Path, env: dict[str, str], out: Path, seconds: float) -> tuple[Path, Path]:
    """A task killed ~1,000 tokens in; its relaunched server recorded from its start
    (py-spy attaches as it is launched and follows the engine it spawns) for
    ``seconds``, past the task's next text."""
    count = token_counter()

    plan = compare.Plan.pick()
    server = Server(work / "data", dict(env, LMSP_DEFAULT_ON_RESTART="resume")).start()
    stacks = Path(f"{out}-both.txt")
    launch = server.launch
    spies: list[subprocess.Popen[bytes]] = []

    def launch_spied() -> subprocess.Popen[bytes]:  # the relaunch after the kill
        proc = launch()
        spies.append(record(proc.pid, seconds, stacks, native=False, children=True))
        return proc

    server.launch = launch_spied  # type: ignore[method-assign]
    try:
        seen, healthy, nxt = compare.resume_once(server, plan, count)
        print(f"resume: {seen} tokens in, healthy after {healthy:.2f} s, next text {nxt:.2f} s")
        for spy in spies:
            spy.wait(seconds + 120)
    finally:
        server.stop()
    api, engine = Path(f"{out}-api.txt"), Path(f"{out}-engine.txt")
    for path in (api, engine):
        path.unlink(missing_ok=True)
    split_processes(stacks, api, engine)
    return api, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    loads = ["streams", "creates", "resume", "remote", "ceiling", "prefix"]
    parser.add_argument("--load", choices=loads, default="streams")
    parser.add_argument("--svg", action="store_true", help="flame graphs too (OUT-*.svg)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="pyspy", help="OUT-api.txt, OUT-engine.txt")
    parser.add_argument("--exact", action="store_true", help="the server in exact mode")
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    parser.add_argument("--streams", type=int, default=None, help="streams generating")
    args = parser.parse_args()
    plan = compare.Plan.pick()
    env = compare.lmsp_env()
    if args.exact:
        env["LMSP_EXACT"] = "1"
    out = Path(args.out).resolve()
    if args.load == "remote":
        with tempfile.TemporaryDirectory(prefix="lmsp-pyspy-") as work:
            report(*profile_remote(Path(work), out, args.seconds, args.svg, args.gil))
        return
    if args.load == "ceiling":
        with tempfile.TemporaryDirectory(prefix="lmsp-pyspy-") as work:
            report(*profile_ceiling(Path(work), out, args.seconds, args.svg, args.gil))
        return
    if args.load == "resume":
        with tempfile.TemporaryDirectory(prefix="lmsp-pyspy-") as work:
            api_out, engine_out = profile_resume(Path(work), env, out, min(args.seconds, 5.0))
        report(api_out, engine_out)
        return
    with tempfile.TemporaryDirectory(prefix="lmsp-pyspy-") as work:
        server = Server(Path(work) / "data", env).start()
        try:
            side = compare.lmsp_side(server)
            with side.client() as http:
                side.stream(http, compare.messages_for(compare.SUBJECTS[7]), 4)
            engine = compare.engine_pid(server)
            assert server.proc is not None and engine is not None
            if args.load == "prefix":
                api_out, engine_out = profile_prefix(side, server, out, args, plan)
                return report(api_out, engine_out)
            loading = Streaming(side, args.streams or plan.streams, plan.stream_tokens)
            creating = None
            if args.load == "creates":  # 64 clients, in a process of their own
                body = {
                    "model": compare.MODEL,
                    "input": "durable hello",
                    "background": True,
                    "max_output_tokens": 8,
                }
                pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                creating = pool.submit(
                    creates_process,
                    side.url,
                    side.headers,
                    body,
                    plan.creators,
                    time.time() + 2.0,
                    args.seconds + 4.0,
                )
                time.sleep(2.5)
            api_out, engine_out = spy_both(
                server.proc.pid, engine, out, args.seconds, args.svg, args.gil
            )
            if creating is not None:
                latencies, errors = creating.result()
                print(
                    f"creates: {len(latencies) / (args.seconds + 4.0):.0f}/s, {len(errors)} errors"
                )
            loading.stop()
        finally:
            server.stop()
    report(api_out, engine_out)


def profile_prefix(
    side: Side, server: Server, out: Path, args: argparse.Namespace, plan: compare.Plan
) -> tuple[Path, Path]:
    """The warm shared-prefix requests, one after another while both processes are
    recorded: each shares the system prompt a first request read, with a question of its
    own. Their times to first text are printed (the comparison's row)."""
    count = token_counter()

    system = compare.system_prompt(count, plan.prefix_tokens)
    firsts: list[float] = []
    done = threading.Event()

    def warm() -> None:
        with side.client() as http:
            n = 0
            while not done.is_set():
                n += 1
                question = f"{compare.QUESTIONS[1]} (question {n})"
                run = side.stream(http, compare.prefix_messages(system, question), 8)
                if run.first is not None:
                    firsts.append(run.first)

    with side.client() as http:  # the prefix read once, in full
        side.stream(http, compare.prefix_messages(system, compare.QUESTIONS[0]), 8)
    engine = compare.engine_pid(server)
    assert server.proc is not None and engine is not None
    thread = threading.Thread(target=warm, daemon=True)
    thread.start()
    try:
        spied = spy_both(server.proc.pid, engine, out, args.seconds, args.svg, args.gil)
    finally:
        done.set()
        thread.join(120)
    firsts.sort()
    middle = firsts[len(firsts) // 2] * 1000 if firsts else float("nan")
    print(f"warm requests: {len(firsts)}, time to first text median {middle:.0f} ms")
    return spied


class Streaming:
    """``streams`` concurrent streams of ``tokens`` through ``side``, again and again,
    in a thread, until :meth:`stop`."""

    def __init__(self, side: Side, streams: int, tokens: int) -> None:
        self.done = threading.Event()

        def load() -> None:
            while not self.done.is_set():
                compare.concurrent(side, streams, tokens)

        self.thread = threading.Thread(target=load, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(300)


def spy_both(
    api: int, engine: int, out: Path, seconds: float, svg: bool, gil: bool = False
) -> tuple[Path, Path]:
    """Record the API process and the engine process for ``seconds`` (collapsed stacks
    for :func:`summary`; with ``svg`` flame graphs too, ``OUT-api.svg`` and
    ``OUT-engine.svg``; ``gil``: only the samples holding the interpreter's lock)."""
    api_out, engine_out = Path(f"{out}-api.txt"), Path(f"{out}-engine.txt")
    for path in (api_out, engine_out):
        path.unlink(missing_ok=True)
    spies = [
        record(api, seconds, api_out, False, gil=gil),
        record(engine, seconds, engine_out, False, gil=gil),
    ]
    if svg:
        spies.append(record(api, seconds, Path(f"{out}-api.svg"), False, fmt="flamegraph"))
        spies.append(record(engine, seconds, Path(f"{out}-engine.svg"), False, fmt="flamegraph"))
    for spy in spies:
        spy.wait(seconds + 120)
    return api_out, engine_out


def profile_ceiling(
    work: Path, out: Path, seconds: float, svg: bool, gil: bool
) -> tuple[Path, Path]:
    """The control plane's peak: bench/ceiling.py's 64 clients creating durable
    responses back to back, the test engine at full speed, both processes recorded."""
    from bench import ceiling

    server = ceiling.serve(work, 24)
    try:
        body = {"model": ceiling.MODEL, "input": "durable hello", "background": True}
        headers = {"Authorization": f"Bearer {server.token}"}
        with server.client() as http:
            http.post("/v1/responses", json={"model": ceiling.MODEL, "input": "warm"})
        engine = ceiling.engine_pid(server)
        assert server.proc is not None and engine is not None
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            creating = pool.submit(
                creates_process,
                server.url,
                headers,
                body,
                ceiling.CLIENTS,
                time.time() + 2.0,
                seconds + 4.0,
            )
            time.sleep(3.0)
            spied = spy_both(server.proc.pid, engine, out, seconds, svg, gil)
            latencies, errors = creating.result()
        print(f"creates: {len(latencies) / (seconds + 4.0):.0f}/s, {len(errors)} errors")
        return spied
    finally:
        server.stop()


def profile_remote(
    work: Path, out: Path, seconds: float, svg: bool, gil: bool = False
) -> tuple[Path, Path]:
    """8 streams on a remote model (bench/remote.py's pair: lmsp in front of a
    ``llama-server`` with 8 slots) while both lmsp processes are recorded."""
    from bench import remote

    upstream, server = remote.start_pair(work)
    try:
        side = remote.remote_side(server)
        with side.client() as http:
            side.stream(http, compare.messages_for(compare.SUBJECTS[7]), 4)
        engine = compare.engine_pid(server, remote.MODEL)
        assert server.proc is not None and engine is not None
        loading = Streaming(side, remote.STREAMS, 128)
        try:
            return spy_both(server.proc.pid, engine, out, seconds, svg, gil)
        finally:
            loading.stop()
    finally:
        server.stop()
        upstream.stop()


def report(api_out: Path, engine_out: Path) -> None:
    for name, path in (("API process", api_out), ("engine process", engine_out)):
        print(f"\n{name} ({path}):")
        print(summary(path) if path.exists() else "  (py-spy wrote nothing)")


if __name__ == "__main__":
    main()
