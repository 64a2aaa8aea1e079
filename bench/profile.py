"""Profile lmsp's event loop while 64 clients create durable responses and 8 streams
generate (the case of issue 10's "API that stays fast while the model works").

    .venv/bin/python bench/profile.py [--seconds 10] [--out profile.html]

``lmsp serve`` runs under pyinstrument (a dev dependency), which samples the thread that
runs the event loop; the report is written when the server stops, as text and HTML
(``--out``). ``LMSP_BENCH_QUICK=1`` shortens the load.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import compare  # noqa: E402
from tests.helpers import Server  # noqa: E402


class ProfiledServer(Server):
    """``lmsp serve`` under ``pyinstrument``: its report is written at a clean exit."""

    def __init__(self, data_dir: Path, env: dict[str, str], report: Path) -> None:
        super().__init__(data_dir, env)
        self.report = report

    def launch(self) -> subprocess.Popen[bytes]:
        import os

        env = dict(os.environ)
        env.update(
            {
                "LMSP_DATA_DIR": str(self.data_dir),
                "LMSP_PORT": str(self.port),
                "LMSP_HOST": "127.0.0.1",
                **self.extra_env,
            }
        )
        log = self.log_path.open("ab")
        command = [sys.executable, "-m", "pyinstrument", "--renderer", "pyisession"]
        command += ["--outfile", str(self.report), "-m", "lmsp", "serve"]
        self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self.proc

    def stop(self) -> None:
        """SIGINT: uvicorn re-raises a SIGTERM after shutting down, which would end the
        process before pyinstrument writes; an interrupt ends it through Python."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None

    def kill(self) -> None:  # bench_creates ends with a kill: stop cleanly instead
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=None, help="how long the creates run")
    parser.add_argument("--out", default="profile", help="reports: OUT.html, OUT.txt")
    args = parser.parse_args()
    plan = compare.Plan.pick()
    if args.seconds is not None:
        plan.create_seconds = args.seconds
    out = Path(args.out).resolve()
    report = out.with_suffix(".pyisession")
    env = compare.lmsp_env()  # the server the comparison's create benchmark runs
    with tempfile.TemporaryDirectory(prefix="lmsp-profile-") as work:
        server = ProfiledServer(Path(work) / "data", env, report).start()
        try:
            compare.bench_creates(server, plan, compare.Figures())
        finally:
            server.stop()
    for renderer, suffix in (("html", ".html"), ("text", ".txt")):
        render = [sys.executable, "-m", "pyinstrument", "--load", str(report)]
        render += ["--renderer", renderer, "--outfile", str(out.with_suffix(suffix))]
        subprocess.run(render, check=True)
    print(f"\nprofile of the event loop's thread: {out}.html, {out}.txt")


if __name__ == "__main__":
    main()
