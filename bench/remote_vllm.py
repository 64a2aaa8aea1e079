"""The remote-engine checks against a vLLM (or SGLang) upstream, for a GPU machine.

    vllm serve Qwen/Qwen2.5-0.5B-Instruct --port 8000 \\
        --structured-outputs-config.backend guidance      # VLLM_BATCH_INVARIANT=1: exact
    .venv/bin/python bench/remote_vllm.py --url http://127.0.0.1:8000 \\
        --upstream-model Qwen/Qwen2.5-0.5B-Instruct --tokenizer ./qwen2.5-0.5b-q8_0.gguf

It starts a throw-away ``lmsp serve``, adds the remote model (the tokenizer check and the
capability probe run then: their result is printed), and reports: a greedy background
response against the upstream's own greedy answer to the same token ids; a cancel's
effect on the upstream (``vllm:num_requests_running`` in its ``/metrics``); and 8
concurrent greedy streams through lmsp against the same 8 sent to the upstream directly.
docs/remote-engines.md says what each line means. Nothing here runs in the test suite:
this project's CI has no GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import Server

from lmsp.engines.llama_cpp import LlamaTokenizer

MODEL = "remote-vllm"
PROMPT = "Write a short paragraph about lighthouses."


def running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)", text, re.M)
    return float(found.group(1)) if found else float("nan")


def direct(url: str, model: str, tokens: list[int], n: int) -> list[int]:
    body = {
        "model": model,
        "prompt": tokens,
        "max_tokens": n,
        "temperature": 0,
        "return_token_ids": True,
    }
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=600).json()
    return [int(t) for t in answer["choices"][0]["token_ids"]]


def lmsp_greedy(http: httpx.Client, n: int) -> str:
    body = {"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": n}
    done: dict[str, Any] = http.post("/v1/responses", json=body, timeout=600).json()
    return "".join(c.get("text", "") for o in done.get("output", []) for c in o.get("content", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--upstream-model", required=True)
    parser.add_argument("--tokenizer", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    tokenizer = LlamaTokenizer(args.tokenizer, 0)
    prompt = tokenizer.prompt_tokens([{"role": "user", "content": PROMPT}])
    with tempfile.TemporaryDirectory(prefix="lmsp-vllm-") as tmp:
        server = Server(Path(tmp) / "data", env={"LMSP_PARALLEL": "8"}).start()
        try:
            with server.client(timeout=600) as http:
                remote = {"url": args.url, "upstream_model": args.upstream_model, "inflight": 8}
                body = {"id": MODEL, "path": str(args.tokenizer.resolve()), "remote": remote}
                added = http.post("/v1/models", json=body)
                print("add:", added.status_code, added.json().get("remote") or added.text)
                added.raise_for_status()
                text = lmsp_greedy(http, args.tokens)
                ids = direct(args.url, args.upstream_model, prompt, args.tokens)
                expected = bytes(tokenizer.llm.detokenize(ids)).decode("utf-8", "replace")
                print("greedy text equals the upstream's:", text == expected)
                long = {"model": MODEL, "input": PROMPT, "background": True}
                made = http.post("/v1/responses", json={**long, "max_output_tokens": 4000})
                rid = made.json()["id"]
                time.sleep(2.0)
                http.post(f"/v1/responses/{rid}/cancel")
                began = time.perf_counter()
                while running(args.url) > 0 and time.perf_counter() - began < 10:
                    time.sleep(0.005)
                print(f"upstream idle {1000 * (time.perf_counter() - began):.0f} ms after cancel")
                for name, call in (
                    ("lmsp", lambda: lmsp_greedy(http, args.tokens)),
                    ("direct", lambda: direct(args.url, args.upstream_model, prompt, args.tokens)),
                ):
                    began = time.perf_counter()
                    with concurrent.futures.ThreadPoolExecutor(8) as pool:
                        list(pool.map(lambda _, call=call: call(), range(8)))
                    print(f"8 streams x {args.tokens} tokens, {name}: ", end="")
                    print(f"{time.perf_counter() - began:.2f} s")
        finally:
            server.stop()
            tokenizer.close()


if __name__ == "__main__":
    main()
