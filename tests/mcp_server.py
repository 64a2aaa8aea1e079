"""A real MCP server for the tests (the official ``mcp`` SDK, streamable HTTP on
loopback), run as a process of its own so that it outlives a ``kill -9`` of lmsp:
``python -m tests.mcp_server PORT LEDGER``.

Every tool call that has an effect appends one line to the ledger file, so a test counts
effects exactly. Tools:

- ``record(note)``: an effect, not idempotent (``readOnlyHint: false``);
- ``slow_record(note)``: the same effect, then a minute's wait (a call in flight);
- ``slow_read(key)``: read-only; logs a ``read`` line; its first call waits a minute,
  later ones answer at once;
- ``hang(x)``: never answers;
- ``pause(ms)``: read-only; waits ``ms`` milliseconds (the benchmark's tool);
- ``whoami()``: read-only; says whether the ``X-Token`` header came with the call.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

Note = Annotated[str, Field(max_length=12)]

EFFECT = ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=False)
READ = ToolAnnotations(readOnlyHint=True)


def build(ledger: Path, token: str = "sesame") -> MCPServer:
    server: MCPServer = MCPServer("lmsp-test-tools")

    def write(line: str) -> int:
        with ledger.open("a") as out:
            out.write(line + "\n")
            out.flush()
        return len(ledger.read_text().splitlines())

    @server.tool(annotations=EFFECT, description="Record a note in the ledger.")
    def record(note: Note) -> str:
        count = write(f"record {note}")
        return f"recorded note number {count}"

    @server.tool(annotations=EFFECT, description="Record a note in the ledger, slowly.")
    async def slow_record(note: Note) -> str:
        count = write(f"slow_record {note}")
        await asyncio.sleep(60)
        return f"recorded note number {count}"

    @server.tool(annotations=READ, description="Read a value (the first read is slow).")
    async def slow_read(key: Note) -> str:
        count = write(f"read {key}")
        if count == 1:
            await asyncio.sleep(60)
        return f"the value of {key} is 42 (read {count})"

    @server.tool(annotations=READ, description="Never answers.")
    async def hang(x: Note) -> str:
        await asyncio.sleep(3600)
        return x

    @server.tool(annotations=READ, description="Wait ms milliseconds (the benchmark's tool).")
    async def pause(ms: Annotated[int, Field(ge=0, le=1000)]) -> str:
        await asyncio.sleep(ms / 1000)
        return f"waited {ms} ms"

    @server.tool(annotations=READ, description="Who is calling.")
    def whoami(ctx: Context) -> str:  # type: ignore[type-arg]
        request = ctx.request_context.request
        headers = getattr(request, "headers", {}) or {}
        return "token ok" if headers.get("x-token") == token else "no token"

    return server


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    ledger.touch()
    build(ledger).run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
