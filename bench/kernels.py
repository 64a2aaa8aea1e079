"""How llama.cpp's context settings cost on this machine, through lmsp's own context
(:class:`lmsp.engines.llama_context.LlamaContext`): the figures behind the fast layout
(docs/performance.md).

    .venv/bin/python bench/kernels.py [--quick]

For each layout (flash attention on/off, one KV stream per sequence or a unified cache,
256- or 512-token micro-batches): a cold 1,500-token prompt evaluated in full
micro-batches (tok/s), 8 sequences decoding together after 64-token prompts (tok/s),
and one sequence decoding alone (tok/s). Raw llama.cpp, no scheduling or sampling:
the ceiling lmsp's engine loop can reach with each layout.
"""

from __future__ import annotations

import argparse
import os
import time

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.batch import Request
from lmsp.engines.llama_context import Layout, LlamaContext, load_model


def _prompt(ctx: LlamaContext, seq: int, tokens: list[int]) -> float:
    start = time.perf_counter()
    for at in range(0, len(tokens), ctx.max_tokens):
        part = tokens[at : at + ctx.max_tokens]
        ctx.decode([Request(seq, part, at, at + len(part) == len(tokens))])
    return time.perf_counter() - start


def _decode(ctx: LlamaContext, seqs: list[int], start: int, steps: int) -> float:
    began = time.perf_counter()
    for i in range(steps):
        ctx.decode([Request(s, [100 + (i % 50)], start + i, True) for s in seqs])
    return time.perf_counter() - began


def measure(layout: Layout, threads: int, long_prompt: int, steps: int) -> dict[str, float]:
    ctx = LlamaContext(load_model(bundled_model_path()), 2048, 8, threads, layout)
    try:
        tokens = [(7 * i) % 40000 + 200 for i in range(long_prompt)]
        cold = _prompt(ctx, 0, tokens)
        ctx.trim(0, 0)
        for s in range(8):
            _prompt(ctx, s, tokens[s : s + 64])
        eight = _decode(ctx, list(range(8)), 64, steps)
        for s in range(8):
            ctx.trim(s, 64)
        one = _decode(ctx, [0], 64, steps)
        return {
            "prompt tok/s": long_prompt / cold,
            "8-seq decode tok/s": 8 * steps / eight,
            "1-seq decode tok/s": steps / one,
        }
    finally:
        ctx.close()


def main() -> None:
    from lmsp.engines.llama_cpp import _route_native_logs

    _route_native_logs()  # llama.cpp's own messages to the log, not the table
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer layouts, shorter runs")
    args = parser.parse_args()
    threads = int(os.environ.get("LMSP_THREADS", "0")) or (os.cpu_count() or 1)
    layouts = [
        Layout(ubatch=512, flash_attn=1, unified=False),
        Layout(ubatch=256, flash_attn=1, unified=False),
        Layout(ubatch=512, flash_attn=0, unified=False),
        Layout(ubatch=512, flash_attn=1, unified=True),
        Layout(ubatch=512, flash_attn=0, unified=True),
    ]
    if args.quick:
        layouts = layouts[:2]
    steps = 16 if args.quick else 64
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(
        "| ubatch | flash attn | KV | prompt 1,500 tok/s"
        " | 8-seq decode tok/s | 1-seq decode tok/s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for layout in layouts:
        got = measure(layout, threads, 1500, steps)
        kv = "unified" if layout.unified else "per sequence"
        fa = {1: "on", 0: "off", -1: "auto"}[layout.flash_attn]
        print(
            f"| {layout.ubatch} | {fa} | {kv} | {got['prompt tok/s']:.0f}"
            f" | {got['8-seq decode tok/s']:.0f} | {got['1-seq decode tok/s']:.0f} |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
