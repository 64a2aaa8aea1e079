"""Profile both processes of lmsp — the API process and the model's engine process —
with py-spy while 8 streams generate (the 8 x 128 benchmark's load, repeated).

    .venv/bin/python bench/pyspy.py [--seconds 20] [--out pyspy] [--exact]

py-spy (a dev dependency) samples each process from outside, at 100 Hz, idle threads
left out (``llama_decode`` shows as the Python frame that calls it, ``LlamaContext.decode``);
the collapsed stacks go to ``OUT-api.txt`` and ``OUT-engine.txt`` and a summary is
printed: for each process the functions holding the most samples, inclusive (a frame
anywhere on the stack) and by the frame the samples were taken in (self).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import compare  # noqa: E402
from tests.helpers import Server  # noqa: E402


def record(pid: int, seconds: float, out: Path, native: bool) -> subprocess.Popen[bytes]:
    py_spy = Path(sys.executable).with_name("py-spy")
    command = [str(py_spy), "record", "--pid", str(pid), "--duration", str(int(seconds))]
    command += ["--rate", "100", "--format", "raw", "--output", str(out), "--nonblocking"]
    if native:
        command.append("--native")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def summary(stacks: Path, top: int = 12) -> str:
    """The heaviest functions of a collapsed-stack file (``frame;frame;… count``)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] for f in stack.split(";")]
        for frame in set(frames[1:]):  # the thread's name is the first
            inclusive[frame] += n
        own[frames[-1]] += n
    if not total:
        return "  (no samples: the process was idle)"
    lines = [f"  {total} samples (busy threads only)", "  inclusive:"]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
    lines += ["  self:"]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="pyspy", help="OUT-api.txt, OUT-engine.txt")
    parser.add_argument("--exact", action="store_true", help="the server in exact mode")
    args = parser.parse_args()
    plan = compare.Plan.pick()
    env = compare.lmsp_env()
    if args.exact:
        env["LMSP_EXACT"] = "1"
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory(prefix="lmsp-pyspy-") as work:
        server = Server(Path(work) / "data", env).start()
        try:
            side = compare.lmsp_side(server)
            with side.client() as http:
                side.stream(http, compare.messages_for(compare.SUBJECTS[7]), 4)
            engine = compare.engine_pid(server)
            assert server.proc is not None and engine is not None
            stop = threading.Event()

            def load() -> None:
                while not stop.is_set():
                    compare.concurrent(side, plan.streams, plan.stream_tokens)

            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            api_out, engine_out = Path(f"{out}-api.txt"), Path(f"{out}-engine.txt")
            spies = [
                record(server.proc.pid, args.seconds, api_out, native=False),
                record(engine, args.seconds, engine_out, native=False),
            ]
            for spy in spies:
                spy.wait(args.seconds + 120)
            stop.set()
            loader.join(300)
        finally:
            server.stop()
    for name, path in (("API process", api_out), ("engine process", engine_out)):
        print(f"\n{name} ({path}):")
        print(summary(path) if path.exists() else "  (py-spy wrote nothing)")


if __name__ == "__main__":
    main()
