"""(h) Embeddings per second: lmsp's ``POST /v1/embeddings`` against llama-server's on the
same GGUF (issue 20; goal: lmsp at least 0.9x the faster llama-server).

The bundled model has no pooling of its own (a generative model): lmsp pools it by its
last token, so llama-server runs with ``--embeddings --pooling last`` and both return
L2-normalised vectors; the first rows check that they return the same vectors. Each
server embeds the same corpus two ways: batches of ``BATCH`` inputs, one request after
another, and single-input requests from ``CLIENTS`` concurrent clients. llama-server
runs with its defaults and with ``--no-repack -fa on`` (lmsp's kernels); lmsp is held
against the faster of the two. Runs alternate; the figure is the median of the reps.
The other load on the machine is printed with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench import llama_server
from bench.clients import MODEL, busy_cpus, median
from bench.compare import quick, threads
from tests.helpers import Server

GOAL = 0.9
BATCH = 16
CLIENTS = 4
N_CTX = 512  # the longest input either server embeds (llama-server: its micro-batch)
SUBJECTS = [
    "a lighthouse keeper",
    "the migration of arctic terns",
    "durable task queues",
    "sourdough bread",
    "the history of the printing press",
    "a chess endgame",
    "volcanic islands",
    "error correcting codes",
]


def corpus(n: int) -> list[str]:
    """``n`` passages of 10 to 60 words, all different."""
    out = []
    for i in range(n):
        subject = SUBJECTS[i % len(SUBJECTS)]
        words = 10 + (i * 7) % 50
        body = " ".join(f"{subject} matters in way {j} of passage {i}" for j in range(words // 8))
        out.append(f"Passage {i} on {subject}: {body}.")
    return out


class Side:
    def __init__(self, name: str, url: str, headers: dict[str, str]) -> None:
        self.name = name
        self.http = httpx.Client(base_url=url, headers=headers, timeout=600)

    def embed(self, texts: list[str]) -> tuple[np.ndarray[Any, Any], int]:
        answer = self.http.post("/v1/embeddings", json={"model": MODEL, "input": texts})
        answer.raise_for_status()
        made = answer.json()
        rows = [d["embedding"] for d in sorted(made["data"], key=lambda d: d["index"])]
        return np.asarray(rows, dtype=np.float32), int(made["usage"]["prompt_tokens"])

    def batched(self, texts: list[str]) -> tuple[float, int]:
        """Seconds to embed ``texts`` in batches, and their tokens."""
        start, tokens = time.perf_counter(), 0
        for at in range(0, len(texts), BATCH):
            tokens += self.embed(texts[at : at + BATCH])[1]
        return time.perf_counter() - start, tokens

    def concurrent(self, texts: list[str]) -> tuple[float, int]:
        start = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            tokens = sum(t for _, t in pool.map(lambda text: self.embed([text]), texts))
        return time.perf_counter() - start, tokens

    def close(self) -> None:
        self.http.close()


def _llama(work: Path, tuned: bool) -> llama_server.LlamaServer | None:
    from lmsp.bootstrap import bundled_model_path

    try:
        binary = llama_server.ensure_built()
        return llama_server.LlamaServer(
            binary,
            bundled_model_path(),
            threads=threads(),
            parallel=8,
            n_ctx=N_CTX,
            log=work / f"llama-server-embed-{'tuned' if tuned else 'defaults'}.log",
            flags=llama_server.FAST_FLAGS if tuned else llama_server.DEFAULT_FLAGS,
            extra=("--embeddings", "--pooling", "last", "-b", str(N_CTX), "-ub", str(N_CTX)),
        ).start()
    except Exception as exc:
        print(f"\n*** llama-server did not start for embeddings: {exc}", flush=True)
        return None


def bench_embeddings(
    work: Path, reps: int, table: Callable[[str, list[str], list[list[str]]], None]
) -> list[list[str]]:
    texts = corpus(32 if quick() else 128)
    busy = busy_cpus()
    lmsp = Server(
        work / "embed-data",
        {"LMSP_THREADS": str(threads()), "LMSP_EMBED_MAX_TOKENS": str(N_CTX)},
    ).start()
    servers = [s for s in (_llama(work, False), _llama(work, True)) if s is not None]
    sides = [Side("lmsp", lmsp.url, {"Authorization": f"Bearer {lmsp.token}"})]
    names = ["llama-server (defaults)", "llama-server (--no-repack -fa on)"]
    for name, server in zip(names, servers, strict=False):
        sides.append(Side(name, server.url, {}))
    rows: list[list[str]] = []
    try:
        reference, _ = sides[0].embed(texts[:8])  # warm-up, and the vectors to compare
        for side in sides[1:]:
            theirs, _ = side.embed(texts[:8])
            cosine = float(np.min(np.sum(reference * theirs, axis=1)))
            rows.append([f"same vectors as {side.name}: min cosine", f"{cosine:.5f}", "", ""])
        for how in ("batched", "concurrent"):
            seconds: dict[str, list[float]] = {side.name: [] for side in sides}
            tokens: dict[str, int] = {}
            for _ in range(reps):
                for side in sides:
                    took, tokens[side.name] = getattr(side, how)(texts)
                    seconds[side.name].append(took)
            label = f"batches of {BATCH}" if how == "batched" else f"{CLIENTS} clients, 1 input"
            rates = {name: len(texts) / median(s) for name, s in seconds.items()}
            for name, rate in rates.items():
                per_token = tokens[name] / median(seconds[name])
                rows.append([f"{name}, {label}", f"{rate:.1f}", f"{per_token:.0f}", ""])
            others = [rate for name, rate in rates.items() if name != "lmsp"]
            if others:
                ratio = rates["lmsp"] / max(others)
                verdict = "MET" if ratio >= GOAL else "MISSED"
                what = f"ratio lmsp / faster llama-server, {label}"
                rows.append([what, f"{ratio:.3f}", "", verdict])
    finally:
        for side in sides:
            side.close()
        lmsp.stop()
        for server in servers:
            server.stop()
    after = busy_cpus()
    table(
        f"(h) Embeddings: {MODEL}, last-token pooling, {len(texts)} passages, median of {reps}"
        f" alternated runs (goal: lmsp / faster llama-server >= {GOAL})",
        ["what", "inputs/s", "tokens/s", "goal"],
        rows,
    )
    print(f"other load on the machine: {busy:.2f} CPUs before, {after:.2f} after")
    if max(busy, after) > 0.25:
        print("*** the machine was busy with other work: these figures are not reliable")
    return rows
