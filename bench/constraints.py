"""The cost of constrained decoding on the bundled model, in an engine process (as the
service runs it; the mask and compile costs are measured in this process).

    .venv/bin/python bench/constraints.py [--tokens 128] [--reps 5]

(c) tokens/s of the same prompt and seed, unconstrained and held to a JSON Schema
    (llguidance's mask computed and applied before every token), runs interleaved,
    medians reported, and their ratio (the goal: at least 0.9); plus the mask's own
    cost per token;
(d) the compile time of a 20-property schema: to a grammar (what a request pays when it
    arrives) and to a matcher over the model's 49,152-token vocabulary (what its first
    task pays; later tasks copy the cached matcher).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lmsp.bootstrap import bundled_model_path  # noqa: E402
from lmsp.constraints import grammar  # noqa: E402
from lmsp.engines import matcher  # noqa: E402
from lmsp.engines.base import LoadOptions, Sampling  # noqa: E402
from lmsp.engines.client import EngineClient  # noqa: E402
from lmsp.engines.llama_cpp import LlamaEngine, LlamaModel, LlamaTokenizer  # noqa: E402
from lmsp.engines.worker import EngineSpec  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper, as JSON."
#: a schema whose answer is long enough to fill the token budget, like the free text
STORY: dict[str, Any] = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


def twenty_properties(salt: int) -> dict[str, Any]:
    kinds: list[dict[str, Any]] = [
        {"type": "string", "maxLength": 30},
        {"type": "integer", "minimum": 0, "maximum": 1000},
        {"type": "number"},
        {"type": "boolean"},
        {"enum": ["a", "b", "c"]},
        {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        {"type": "string", "format": "date"},
    ]
    props = {f"p{salt}_{i}": kinds[i % len(kinds)] for i in range(20)}
    return {"type": "object", "properties": props, "required": sorted(props)}


def run(engine: EngineClient, prompt: list[int], tokens: int, schema: Any) -> tuple[int, float]:
    text = None if schema is None else grammar.json_grammar(schema)
    sampling = Sampling(temperature=1.0, seed=7)
    began = 0.0
    count = 0
    generation = engine.generate(prompt, [], sampling, text, max_tokens=tokens)
    for _ in generation:
        if count == 0:  # the clock starts after the prompt is read: generation only
            began = time.perf_counter()
        count += 1
    generation.close()
    return count - 1, time.perf_counter() - began


def mask_cost(model: LlamaModel, reps: int = 200) -> float:
    """Seconds per token of the mask alone (compute, unpack, consume)."""
    constraint = model.constraint(grammar.json_grammar(STORY))
    text = '{"title": "The Keeper", "story": "' + "It was a dark night and the sea" * 20
    ids = model.guidance_tokenizer().tokenize_str(text)[:reps]
    began = time.perf_counter()
    for token in ids:
        constraint.allowed()
        constraint.advance(token)
    return (time.perf_counter() - began) / len(ids)


def bench_constraints(tokens: int, reps: int) -> list[list[str]]:
    path = bundled_model_path()
    spec = EngineSpec(LlamaEngine(), path, 2048, LoadOptions(), "bench")
    engine = EngineClient(spec, LlamaTokenizer(path, 2048)).start()
    try:
        prompt = engine.prompt_tokens([{"role": "user", "content": PROMPT}])
        run(engine, prompt, 8, STORY)  # warm: the tokenizer and the cached matcher
        free: list[float] = []
        held: list[float] = []
        for _ in range(reps):
            n, seconds = run(engine, prompt, tokens, None)
            free.append(n / seconds)
            n, seconds = run(engine, prompt, tokens, STORY)
            held.append(n / seconds)
    finally:
        engine.close()
    model = LlamaModel(path, 2048)
    try:
        per_token = mask_cost(model)
        to_grammar: list[float] = []
        to_matcher: list[float] = []
        tokenizer = model.guidance_tokenizer()
        for salt in range(reps):
            schema = twenty_properties(salt)
            began = time.perf_counter()
            compiled = grammar.json_grammar(schema)
            to_grammar.append(time.perf_counter() - began)
            began = time.perf_counter()
            matcher.compiled(tokenizer, compiled)
            to_matcher.append(time.perf_counter() - began)
    finally:
        model.close()
    ratio = statistics.median(held) / statistics.median(free)
    rows = [
        ["unconstrained tokens/s", f"{statistics.median(free):.1f}"],
        ["JSON-schema tokens/s", f"{statistics.median(held):.1f}"],
        ["ratio (goal >= 0.9)", f"{ratio:.3f}"],
        ["mask per token (ms)", f"{per_token * 1000:.3f}"],
        ["20-property schema -> grammar (ms)", f"{statistics.median(to_grammar) * 1000:.2f}"],
        ["grammar -> matcher, first time (ms)", f"{statistics.median(to_matcher) * 1000:.2f}"],
    ]
    print(f"\n(c, d) constrained decoding: {tokens} tokens, {reps} runs each, medians")
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value.rjust(10)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    bench_constraints(args.tokens, args.reps)


if __name__ == "__main__":
    main()
