"""Resume after a crash, to the next token (issue 40): the API process killed, before and
after engines outlive it, and the engine process killed.

Each repetition runs a real ``lmsp serve`` (the bundled model, greedy, its own data
directory) with one background ``on_restart: resume`` task writing a long story, followed
as a stream to ~1,000 tokens (counted with the model's tokenizer):

- API, engine exits with it: ``kill -9`` of the API process, relaunch
  (``LMSP_ENGINE_ORPHAN_TIMEOUT=0``, the default: a new engine loads the model and
  evaluates the prompt and the ~1,000 committed tokens again); time from the relaunch to
  the task's next text (:func:`bench.compare.resume_once`);
- API, engine reattached: the same with ``LMSP_ENGINE_ORPHAN_TIMEOUT=60s``: the new API
  process reattaches to the running engine, whose KV cache still holds the sequence;
- API, a standby takes over: the same with an ``lmsp serve --standby`` waiting on the
  directory and port; time from the kill (nothing is relaunched);
- engine: ``kill -9`` of the engine process (the API lives on): time from the kill to the
  first text after the task's ``resumed`` event (a new engine started by the supervisor;
  then with ``LMSP_SPARE_ENGINE=1``, the model's spare engine taking over).

Medians of ``reps`` (3; 1 with ``LMSP_BENCH_QUICK``, at ~150 tokens); ``LMSP_REATTACH_AT``
sets how many tokens in and ``LMSP_REATTACH_REPS`` how many repetitions (on a busy machine). Alone:
``.venv/bin/python -m bench.reattach``; in ``bench/run.py``: ``--only reattach``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench.clients import TERMINAL, median, sse_lines
from bench.compare import Plan, engine_pid, lmsp_env, num, resume_body, resume_once
from tests.helpers import Server

Count = Callable[[str], int]


def engine_kill_once(
    server: Server, plan: Plan, count: Count, spare: bool = False
) -> tuple[int, float]:
    """A task followed to ``plan.resume_at`` tokens, its engine ``kill -9``: (tokens seen,
    seconds from the kill to the first text after its ``resumed`` event). ``spare``: the
    kill waits until the model's spare engine is ready."""
    body = resume_body(plan)
    text, seen, killed, resumed, nxt = "", 0, 0.0, False, math.nan
    with (
        server.client(timeout=900) as http,
        http.stream("POST", "/v1/responses", json=body) as answer,
    ):
        for event, data in sse_lines(answer):
            if event in TERMINAL:
                break
            if not killed and event == "response.output_text.delta":
                text += json.loads(data)["delta"]
                seen = count(text)
                if seen >= plan.resume_at and (not spare or _spare_ready(server)):
                    pid = engine_pid(server)
                    assert pid is not None
                    os.kill(pid, 9)
                    killed = time.perf_counter()
            elif killed and event == "response.in_progress" and json.loads(data).get("resumed"):
                resumed = True
            elif resumed and event == "response.output_text.delta":
                nxt = time.perf_counter() - killed
                break
    return seen, nxt


def _spare_ready(server: Server) -> bool:
    return "a spare engine for" in server.log_path.read_text(errors="replace")


def bench_reattach(
    work: Path, reps: int, table: Callable[[str, list[str], list[list[str]]], None]
) -> None:
    from llama_cpp import Llama

    from lmsp.bootstrap import bundled_model_path

    plan = Plan.pick()
    if os.environ.get("LMSP_REATTACH_AT"):  # fewer tokens in, on a busy machine
        plan = replace(plan, resume_at=int(os.environ["LMSP_REATTACH_AT"]))
    vocab = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False))

    env = dict(lmsp_env(), LMSP_DEFAULT_ON_RESTART="resume")
    rows: list[list[str]] = []
    try:
        ways = (
            ("API, engine exits with it", "0", False),
            ("API, engine reattached", "60s", False),
            ("API, a standby takes over", "60s", True),
        )
        for name, orphan, standby in ways:
            runs: list[tuple[int, float, float]] = []
            for rep in range(reps):
                data = work / f"reattach-{orphan}-{standby}-{rep}"
                server = Server(data, env=dict(env, LMSP_ENGINE_ORPHAN_TIMEOUT=orphan)).start()
                spare = server.standby() if standby else None
                try:
                    runs.append(resume_once(server, plan, count, spare))
                finally:
                    server.stop()
                    if spare is not None:
                        spare.stop()
            done = [r for r in runs if not math.isnan(r[2])]
            seen = median([float(r[0]) for r in done]) if done else math.nan
            rows.append(
                [
                    f"kill -9 of the {name}",
                    num(seen, ".0f"),
                    f"{num(median([r[2] for r in done]), '.2f')} (healthy"
                    f" {num(median([r[1] for r in done]), '.2f')})",
                    " ".join(num(r[2], ".2f") for r in runs),
                ]
            )
            print(rows[-1], flush=True)
        for name, spare in (("", "0"), (", a spare takes over", "1")):
            kills: list[tuple[int, float]] = []
            for rep in range(reps):
                data = work / f"engine-kill-{spare}-{rep}"
                server = Server(data, env=dict(env, LMSP_SPARE_ENGINE=spare)).start()
                try:
                    kills.append(engine_kill_once(server, plan, count, spare == "1"))
                finally:
                    server.stop()
            rows.append(
                [
                    f"kill -9 of the engine process{name}",
                    num(median([float(k[0]) for k in kills]), ".0f"),
                    num(median([k[1] for k in kills]), ".2f"),
                    " ".join(num(k[1], ".2f") for k in kills),
                ]
            )
            print(rows[-1], flush=True)
    finally:
        vocab.close()
    table(
        f"resume to the next token after a crash (s), median of {reps}",
        ["crash", "tokens in", "to the next token (s)", "each run"],
        rows,
    )


def main() -> None:
    from bench.compare import quick
    from bench.run import table  # make bench's table, when run alone

    with tempfile.TemporaryDirectory(prefix="lmsp-reattach-") as work:
        reps = int(os.environ.get("LMSP_REATTACH_REPS", "0")) or (1 if quick() else 3)
        bench_reattach(Path(work), reps, table)


if __name__ == "__main__":
    main()
