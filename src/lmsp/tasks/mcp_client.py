"""lmsp as an MCP client (the official ``mcp`` SDK, streamable HTTP).

The runner's workers are threads; the SDK is async. One event loop, on a daemon thread
of its own, runs every MCP request of the process; a worker submits one and gets a
:class:`concurrent.futures.Future`, which it polls so that a cancel of its task stops
waiting at once (cancelling the future cancels the request: its connection closes).

The SDK is imported by the first request (it takes ~0.7 s: not on a restart's path).

Each request opens its own session (connect, initialize, one request, close): a task
may be resumed on another node or after a restart, and nothing of a session survives
that. Every request is bounded by ``timeout`` (``LMSP_MCP_TIMEOUT``) as a whole, and a
tool's result by ``max_result`` characters. Every connection goes only to an address
``LMSP_MCP_HOSTS``' rule admits (:mod:`lmsp.tasks.outbound`), redirects included.
Header values go to the server and nowhere else: errors name the server's URL, never
its headers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from lmsp.protocol import mcp
from lmsp.protocol.outbound import HostRule
from lmsp.tasks import outbound

if TYPE_CHECKING:  # the SDK takes ~0.7 s to import: only a request that needs it pays
    from mcp import Client

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


class McpFailure(Exception):
    """An MCP request that failed: ``error`` is the ``mcp_call`` error it makes."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(mcp.error_text(error))
        self.error = error


def _the_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="lmsp-mcp", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def submit(work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``work`` on the MCP event loop."""
    return asyncio.run_coroutine_threadsafe(work, _the_loop())


@dataclass(frozen=True)
class Server:
    url: str
    headers: dict[str, str]
    timeout: float
    hosts: tuple[HostRule, ...]  # LMSP_MCP_HOSTS: where a connection may go


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside exception groups (anyio's task groups nest them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _failure(server: Server, exc: BaseException) -> McpFailure:
    import httpx2
    from mcp.shared.exceptions import MCPError

    exc = _leaf(exc)
    if isinstance(exc, McpFailure):
        return exc
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return McpFailure(
            mcp.error_of(
                "mcp_protocol_error",
                f"The MCP server at {server.url} did not answer within {server.timeout:g}s"
                " (LMSP_MCP_TIMEOUT).",
                -32001,
            )
        )
    if isinstance(exc, MCPError):
        return McpFailure(mcp.error_of("mcp_protocol_error", exc.error.message, exc.error.code))
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        return McpFailure(
            mcp.error_of("http_error", f"The MCP server at {server.url} answered {code}.", code)
        )
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return McpFailure(
            mcp.error_of(
                "http_error",
                f"Could not reach the MCP server at {server.url} ({type(exc).__name__}).",
                502,
            )
        )
    return McpFailure(
        mcp.error_of(
            "mcp_protocol_error",
            f"The MCP request to {server.url} failed ({type(exc).__name__}).",
        )
    )


async def _bounded(server: Server, work: Any) -> Any:
    try:
        return await asyncio.wait_for(work, server.timeout)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        raise _failure(server, exc) from None


def _client(server: Server) -> Client:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = outbound.client2(
        server.hosts, httpx2.Timeout(server.timeout, read=server.timeout), server.headers
    )
    return Client(streamable_http_client(server.url, http_client=http), raise_exceptions=True)


async def _list(server: Server) -> list[dict[str, Any]]:
    async with _client(server) as client:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(100):  # pages
            page = await client.list_tools(cursor=cursor)
            tools += [
                t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools
            ]
            cursor = page.next_cursor
            if not cursor:
                break
        return tools


async def _call(
    server: Server, name: str, arguments: dict[str, Any], max_result: int
) -> tuple[str | None, dict[str, Any] | None]:
    async with _client(server) as client:
        result = await client.call_tool(name, arguments, read_timeout_seconds=server.timeout)
    texts: list[str] = []
    for block in result.content:
        shown = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        texts.append(shown["text"] if shown.get("type") == "text" else json.dumps(shown))
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    output = bounded("\n".join(texts), max_result)
    if result.is_error:
        return None, {
            "type": "mcp_tool_execution_error",
            "content": [{"type": "text", "text": output}],
        }
    return output, None


def bounded(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, saying so."""
    if len(text) <= most:
        return text
    return text[:most] + f"\n[… {len(text) - most} more characters cut (LMSP_MCP_MAX_RESULT)]"


def list_tools(server: Server) -> concurrent.futures.Future[list[dict[str, Any]]]:
    """The server's tools (their JSON: ``name``, ``inputSchema``, ``annotations`` …);
    the future fails with :class:`McpFailure`."""
    return submit(_bounded(server, _list(server)))


def call_tool(
    server: Server, name: str, arguments: dict[str, Any], max_result: int
) -> concurrent.futures.Future[tuple[str | None, dict[str, Any] | None]]:
    """``(output, None)`` or ``(None, error)`` of one call; the future fails with
    :class:`McpFailure` when the request itself failed."""
    return submit(_bounded(server, _call(server, name, arguments, max_result)))
