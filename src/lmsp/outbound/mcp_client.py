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
``LMSP_MCP_HOSTS``' rule admits (:mod:`lmsp.outbound.guard`), redirects included.
What is read is bounded as it is read: the bytes of every response body of one
request's session together (``max_bytes``, ``LMSP_MCP_MAX_BYTES``) are counted by the
HTTP transport, before anything parses them; past the cap (or a ``Content-Length`` that
announces it) the connection is dropped and the request fails saying so; a compressed
body is refused (its size is not what is read), and none is asked for. Header values
go to the server and nowhere else: errors name the server's URL, never its headers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from lmsp.outbound import guard as outbound
from lmsp.protocol import mcp
from lmsp.protocol.outbound import HostRule

if TYPE_CHECKING:  # the SDK takes ~0.7 s to import: only a request that needs it pays
    import httpx2
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
    #: the most bytes one request may read (its session's response bodies together)
    max_bytes: int = 1 << 20


@dataclass
class Reading:
    """What one request's session has read of its server's response bodies."""

    most: int
    read: int = 0
    #: why reading stopped (the cap, or a body lmsp does not read), if it did
    refused: str | None = field(default=None)

    def take(self, size: int) -> None:
        """Count ``size`` more bytes (:meth:`refuse` past the cap)."""
        self.read += size
        if self.read > self.most:
            self.refuse(f"sent more than {self.most} bytes (LMSP_MCP_MAX_BYTES)")

    def refuse(self, why: str) -> NoReturn:
        """Stop reading: a stream error, which the SDK reports as the request's."""
        import httpx2

        self.refused = self.refused or why
        raise httpx2.StreamError(self.refused)


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
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, httpx2.TimeoutException)):
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


def _transport(reading: Reading, inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``inner`` (the hosts guard's transport), counting every response body's bytes
    against ``reading`` as they arrive (the SDK reads a JSON body whole before it
    parses it)."""
    import httpx2

    class Counted(httpx2.AsyncByteStream):
        def __init__(self, inner: Any, refusal: str | None) -> None:
            self.inner = inner
            self.refusal = refusal

        async def __aiter__(self) -> AsyncIterator[bytes]:
            if self.refusal is not None:
                reading.refuse(self.refusal)
            async for chunk in self.inner:
                reading.take(len(chunk))
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Capped(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await inner.handle_async_request(request)
            refusal: str | None = None
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            length = response.headers.get("content-length", "").strip()
            if encoding not in ("", "identity"):
                refusal = f"sent a {encoding}-encoded body (lmsp reads only plain ones)"
            elif length.isdigit() and reading.read + int(length) > reading.most:
                refusal = f"announced {length} bytes (more than LMSP_MCP_MAX_BYTES)"
            response.stream = Counted(response.stream, refusal)
            return response

        async def aclose(self) -> None:
            await inner.aclose()

    return Capped()


def _client(server: Server, reading: Reading) -> Client:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = outbound.client2(
        server.hosts,
        httpx2.Timeout(server.timeout, read=server.timeout),
        {**server.headers, "Accept-Encoding": "identity"},
        wrap=lambda inner: _transport(reading, inner),
    )
    return Client(
        streamable_http_client(server.url, http_client=http, max_sse_event_size=server.max_bytes),
        raise_exceptions=True,
    )


def _too_much(server: Server, reading: Reading) -> McpFailure:
    return McpFailure(
        mcp.error_of(
            "mcp_protocol_error",
            f"The MCP server at {server.url} {reading.refused}; the request was dropped.",
        )
    )


@contextlib.contextmanager
def _refusal_of(server: Server, reading: Reading) -> Iterator[None]:
    """Whatever the SDK raises after ``reading`` refused a byte over the bound is that
    refusal (:func:`_too_much`); anything else goes up as it is."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except BaseException:
        if reading.refused is not None:
            raise _too_much(server, reading) from None
        raise


async def _list(server: Server) -> list[dict[str, Any]]:
    reading = Reading(server.max_bytes)
    with _refusal_of(server, reading):
        return await _pages(server, reading)


async def _pages(server: Server, reading: Reading) -> list[dict[str, Any]]:
    async with _client(server, reading) as client:
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
    reading = Reading(server.max_bytes)
    with _refusal_of(server, reading):
        async with _client(server, reading) as client:
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
