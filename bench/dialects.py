"""(i) The Messages API against Chat Completions on the same prompt (issue 20).

One real ``lmsp serve`` with the bundled model; the same user prompt, greedy, the same
number of output tokens, through ``POST /v1/messages`` and ``POST /v1/chat/completions``
(both become the same stored response and task; only the translation and the wire
shapes differ). Runs alternate, streamed over HTTP and answered whole; the figure is the
median request-to-last-byte time of each, and the ratio Messages / Chat Completions
(goal: at most 1.05, i.e. an overhead of 5 % or less). The other load on the machine is
printed with it: on a busy machine the figures are not reliable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench.clients import MODEL, busy_cpus, median, sse_lines
from tests.helpers import Server

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
GOAL = 1.05
PAUSE = 0.25


def _run(
    http: httpx.Client,
    path: str,
    body: dict[str, Any],
    read: Callable[[httpx.Response, bool], tuple[int, str]],
) -> tuple[float, int, str]:
    """One request to its last byte: (seconds, output tokens, text)."""
    stream = bool(body.get("stream"))
    start = time.perf_counter()
    if stream:
        with http.stream("POST", path, json=body) as answer:
            answer.raise_for_status()
            used, text = read(answer, True)
    else:
        answer = http.post(path, json=body)
        answer.raise_for_status()
        used, text = read(answer, False)
    return time.perf_counter() - start, used, text


def _body(tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "seed": 1,
    }


def _read_message(answer: httpx.Response, stream: bool) -> tuple[int, str]:
    if not stream:
        made = answer.json()
        return made["usage"]["output_tokens"], made["content"][0]["text"]
    text, used = "", 0
    for event, data in sse_lines(answer):
        payload = json.loads(data)
        if event == "content_block_delta" and payload["delta"]["type"] == "text_delta":
            text += payload["delta"]["text"]
        elif event == "message_delta":
            used = payload["usage"]["output_tokens"]
    return used, text


def _read_chat(answer: httpx.Response, stream: bool) -> tuple[int, str]:
    if not stream:
        made = answer.json()
        return made["usage"]["completion_tokens"], made["choices"][0]["message"]["content"]
    text, used = "", 0
    for _, data in sse_lines(answer):
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
        if chunk.get("usage"):
            used = chunk["usage"]["completion_tokens"]
    return used, text


def _messages(http: httpx.Client, tokens: int, stream: bool) -> tuple[float, int, str]:
    body = {**_body(tokens), "stream": stream}
    return _run(http, "/v1/messages", body, _read_message)


def _chat(http: httpx.Client, tokens: int, stream: bool) -> tuple[float, int, str]:
    body = {**_body(tokens), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return _run(http, "/v1/chat/completions", body, _read_chat)


def bench_dialects(
    work: Path,
    tokens: int,
    reps: int,
    table: Callable[[str, list[str], list[list[str]]], None],
) -> list[list[str]]:
    busy = busy_cpus()
    server = Server(work / "dialects-data").start()
    rows: list[list[str]] = []
    same = True
    try:
        with server.client(timeout=600) as http:
            _messages(http, 8, False)  # warm-up: lmsp loads its model on first use
            _chat(http, 8, False)
            for stream in (True, False):
                seconds: dict[str, list[float]] = {"messages": [], "chat": []}
                texts: dict[str, str] = {}
                used: dict[str, int] = {}
                for _ in range(reps):  # alternated, so drift and noise hit both alike
                    for name, run in (("messages", _messages), ("chat", _chat)):
                        took, used[name], texts[name] = run(http, tokens, stream)
                        seconds[name].append(took)
                        time.sleep(PAUSE)
                same = same and texts["messages"] == texts["chat"]
                ratio = median(seconds["messages"]) / median(seconds["chat"])
                label = "streamed" if stream else "whole answer"
                for name, path in (("chat", "/v1/chat/completions"), ("messages", "/v1/messages")):
                    rows.append(
                        [
                            f"{path}, {label}",
                            f"{used[name]}",
                            f"{median(seconds[name]) * 1000:.0f}",
                            f"{used[name] / median(seconds[name]):.1f}",
                            "",
                        ]
                    )
                verdict = "MET" if ratio <= GOAL else "MISSED"
                rows.append(
                    [f"ratio messages / chat, {label}", "", f"{ratio:.3f}", "", f"{verdict}"]
                )
    finally:
        server.stop()
    after = busy_cpus()
    table(
        f"(i) Messages vs Chat Completions: {MODEL}, greedy, {tokens} tokens, the same"
        f" prompt, median of {reps} alternated runs (goal: messages / chat <= {GOAL})",
        ["path", "out tok", "ms", "tok/s", "goal"],
        rows,
    )
    print(f"same greedy text from both: {'yes' if same else 'no'}")
    print(f"other load on the machine: {busy:.2f} CPUs before, {after:.2f} after")
    if max(busy, after) > 0.25:
        print("*** the machine was busy with other work: these figures are not reliable")
    return rows
