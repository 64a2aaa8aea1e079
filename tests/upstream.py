"""A real upstream for the remote-engine tests: llama.cpp's own ``llama-server``, built
once per machine from the installed llama-cpp-python's source distribution
(``bench/llama_server.py``, 10-45 minutes on two cores, cached in
``~/.cache/lmsp-bench``), started on loopback with the bundled GGUF.

Without the binary the tests that need it skip, saying how to build it, unless
``LMSP_REQUIRE_LLAMA_SERVER=1`` (CI: ``.ci/run`` builds it first), where they fail.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench import llama_server

from lmsp.bootstrap import bundled_model_path

REQUIRED = os.environ.get("LMSP_REQUIRE_LLAMA_SERVER") == "1"


def binary() -> Path:
    """The built ``llama-server``, else a skip (a failure under ``REQUIRED``)."""
    path = llama_server.binary_path(llama_server.installed_version())
    if path.exists():
        return path
    why = (
        f"llama-server is not built ({path} is missing): build it once with "
        "`.venv/bin/python bench/llama_server.py` (10-45 minutes on two cores)"
    )
    if REQUIRED:
        pytest.fail(why + "; LMSP_REQUIRE_LLAMA_SERVER=1 says it must be there")
    pytest.skip(why)


class Upstream:
    """A ``llama-server`` on the bundled model, on a free loopback port kept across
    restarts (a killed upstream comes back at the same URL)."""

    def __init__(
        self, log: Path, parallel: int = 2, n_ctx: int = 2048, extra: tuple[str, ...] = ()
    ) -> None:
        self.server = llama_server.LlamaServer(
            binary(),
            bundled_model_path(),
            threads=1,
            parallel=parallel,
            n_ctx=n_ctx,
            log=log,
            extra=("--slots", "--metrics", *extra),
        )
        self.url = self.server.url

    def start(self) -> Upstream:
        self.server.start()
        return self

    def kill(self) -> None:
        """``kill -9``."""
        proc = self.server.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        self.server.proc = None

    def stop(self) -> None:
        self.server.stop()

    def greedy(self, tokens: list[int], n_predict: int) -> list[int]:
        """The upstream's own greedy answer after ``tokens``: its token ids."""
        body = {
            "prompt": tokens,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "repeat_last_n": 2048,
            "return_tokens": True,
            "cache_prompt": False,
        }
        answer = httpx.post(f"{self.url}/completion", json=body, timeout=300)
        answer.raise_for_status()
        return [int(t) for t in answer.json()["tokens"]]

    def slots(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/slots", timeout=30)
        answer.raise_for_status()
        slots: list[dict[str, Any]] = answer.json()
        return slots

    def busy(self) -> int:
        """How many of its slots are generating now."""
        return sum(1 for slot in self.slots() if slot.get("is_processing"))

    def embedding(self, tokens: list[int]) -> list[float]:
        """The upstream's own embedding of ``tokens`` (started with ``--embeddings``)."""
        body = {"input": [tokens], "model": "m", "encoding_format": "float"}
        answer = httpx.post(f"{self.url}/v1/embeddings", json=body, timeout=120)
        answer.raise_for_status()
        return [float(x) for x in answer.json()["data"][0]["embedding"]]
