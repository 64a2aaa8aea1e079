"""(m) MCP tools (issue 27): what a server-side tool loop costs and saves.

Overhead per MCP call: lmsp's MCP client (``lmsp.outbound.mcp_client``, what the loop uses:
a session of its own per request, streamable HTTP on loopback) lists the tools and calls
``pause(ms)``, a tool of ``tests/mcp_server.py`` that waits ``ms`` milliseconds; the
round trip minus the tool's own time is the overhead, for the list and for the call.

A 5-call loop: the real model (smollm2) is made to call ``pause(20)`` five times, then
answer, two ways, same prompt, seed and token budget:

- server loop: one ``POST /v1/responses`` with the MCP tool, ``tool_choice: "required"``
  and ``max_tool_calls: 5`` (lmsp lists, calls, feeds back and generates the answer);
- client loop: the same tool as a function tool; the client calls the MCP server itself
  (the same client code) and sends each result back with ``previous_response_id``
  (``tool_choice: "required"`` for five turns, then ``"none"`` for the answer).

Goal: the server loop's wall time ≤ 1.0 x the client loop's.

    .venv/bin/python bench/mcptools.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import Server  # noqa: E402
from tests.test_mcp_tools import McpServer  # noqa: E402

from lmsp.outbound import mcp_client  # noqa: E402

MODEL = "smollm2-135m-instruct"
TOOL_MS = 20
CALLS = 5
PROMPT = "Wait a little, several times, then say that you are done."


def overhead(url: str, reps: int) -> tuple[float, float]:
    """Median ms of a list round trip, and of a call's minus the tool's own time."""
    server = mcp_client.Server(url, {}, 30, ())
    lists, calls = [], []
    for _ in range(reps):
        began = time.perf_counter()
        mcp_client.list_tools(server).result()
        lists.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        mcp_client.call_tool(server, "pause", {"ms": TOOL_MS}, 65536).result()
        calls.append((time.perf_counter() - began) * 1000 - TOOL_MS)
    return statistics.median(lists), statistics.median(calls)


def server_loop(api: Any, url: str) -> tuple[float, int]:
    began = time.perf_counter()
    response = api.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": PROMPT,
            "tools": [
                {
                    "type": "mcp",
                    "server_label": "bench",
                    "server_url": url,
                    "allowed_tools": ["pause"],
                    "require_approval": "never",
                }
            ],
            "tool_choice": "required",
            "max_tool_calls": CALLS,
            "max_output_tokens": 120,
            "temperature": 0,
            "seed": 1,
        },
    ).json()
    took = time.perf_counter() - began
    return took, sum(1 for item in response["output"] if item["type"] == "mcp_call")


def client_loop(api: Any, url: str, schema: dict[str, Any]) -> tuple[float, int]:
    server = mcp_client.Server(url, {}, 30, ())
    tool = {"type": "function", "name": "pause", "parameters": schema}
    began = time.perf_counter()
    request: dict[str, Any] = {
        "model": MODEL,
        "input": PROMPT,
        "tools": [tool],
        "tool_choice": "required",
        "max_output_tokens": 120,
        "temperature": 0,
        "seed": 1,
        "parallel_tool_calls": False,
    }
    calls = 0
    for turn in range(CALLS + 1):
        response = api.post("/v1/responses", json=request).json()
        found = [item for item in response["output"] if item["type"] == "function_call"]
        if turn == CALLS or not found:
            break
        call = found[0]
        output, error = mcp_client.call_tool(
            server, "pause", json.loads(call["arguments"]), 65536
        ).result()
        calls += 1
        request = {
            **request,
            "previous_response_id": response["id"],
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": output or json.dumps(error),
                }
            ],
            "tool_choice": "required" if turn + 1 < CALLS else "none",
        }
    return time.perf_counter() - began, calls


def bench_mcp(
    work: Path, reps: int, table: Callable[[str, list[str], list[list[str]]], None]
) -> None:
    tools = McpServer(work)
    try:
        listed, called = overhead(tools.url, max(5, reps * 10))
        table(
            "(m) MCP call overhead on loopback (lmsp's client: a session per request)",
            ["step", "median ms (round trip - tool's own time)"],
            [["tools/list", f"{listed:.1f}"], [f"tools/call pause({TOOL_MS})", f"{called:.1f}"]],
        )
        schema = next(
            t["inputSchema"]
            for t in mcp_client.list_tools(mcp_client.Server(tools.url, {}, 30, ())).result()
            if t["name"] == "pause"
        )
        server = Server(work / "data", {"LMSP_MCP_TIMEOUT": "30s"}).start()
        try:
            with server.client(timeout=600) as api:
                api.post(  # warm: the model loaded
                    "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 1}
                )
                rows = []
                for _ in range(reps):
                    s_took, s_calls = server_loop(api, tools.url)
                    c_took, c_calls = client_loop(api, tools.url, schema)
                    rows.append(
                        [
                            f"{s_took:.2f} s ({s_calls} calls)",
                            f"{c_took:.2f} s ({c_calls} calls)",
                            f"{s_took / c_took:.2f}x",
                        ]
                    )
        finally:
            server.stop()
        table(
            f"(m) a {CALLS}-call loop: on the server vs driven by the client (goal <= 1.0x)",
            ["server loop (MCP)", "client loop (function tools)", "server / client"],
            rows,
        )
    finally:
        tools.stop()


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}")
    for row in [header, *rows]:
        print("  " + " | ".join(row))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        bench_mcp(Path(tmp), int(sys.argv[1]) if len(sys.argv) > 1 else 1, _table)
