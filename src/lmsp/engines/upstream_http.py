"""One streamed completion's HTTP exchange with an upstream on the event loop's own
socket: h11 (the HTTP/1.1 state machine httpx itself is built on) over an asyncio
stream, for an upstream reached directly over plain ``http://`` — the usual set-up of a
llama-server, vLLM or SGLang beside lmsp. An upstream behind TLS, or one the
environment sends through a proxy, goes through httpx instead (:mod:`.upstream`).

Why: an upstream streams one chunk a token a sequence, and httpx reads each one through
httpcore's and anyio's layers (a cancel scope and an extra turn of the event loop a
read): 250-280 µs of CPU a chunk against 150 here, measured on llama-server's stream of
the bundled model (the benchmark's own client included in both); on a machine whose
cores the upstream needs, that CPU is taken from the upstream. A new connection needs no
resolver thread for a numeric or ``localhost`` host either.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import h11

#: the largest read from the socket at once
READ_SIZE = 65536


class ExchangeLost(Exception):
    """The connection failed, broke or timed out, or the upstream spoke no HTTP/1.1."""


def direct(url: str) -> bool:
    """Is ``url`` plain ``http://`` reached without a proxy (as httpx, which reads the
    same environment, would reach it)? A URL with credentials in it goes through httpx
    too (it sends them as basic authentication)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or "@" in parts.netloc:
        return False
    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass(parts.hostname))


class Exchange:
    """A request sent and its response's head read; :meth:`body` streams the rest."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: h11.Connection,
        response: h11.Response,
        read_timeout: float,
    ) -> None:
        self._reader, self._writer, self._conn = reader, writer, conn
        self.status = response.status_code
        self._read_timeout = read_timeout

    async def body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come (chunked or not), until its end."""
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed) or event is h11.PAUSED:
                return

    async def read(self) -> bytes:
        return b"".join([data async for data in self.body()])

    async def _next(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        conn = self._conn
        try:
            event = conn.next_event()
            while event is h11.NEED_DATA:
                async with asyncio.timeout(self._read_timeout):
                    data = await self._reader.read(READ_SIZE)
                conn.receive_data(data)  # b"": the connection closed
                event = conn.next_event()
        except (OSError, TimeoutError, h11.RemoteProtocolError) as exc:
            raise ExchangeLost(_why(exc)) from exc
        return event

    def close(self) -> None:
        """Drop the connection (the upstream sees its client gone and stops)."""
        self._writer.close()


@contextlib.asynccontextmanager
async def post(
    url: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    connect_timeout: float,
    read_timeout: float,
) -> AsyncIterator[Exchange]:
    """POST ``body`` (JSON) to ``path`` under ``url``, streaming the answer; the
    connection is dropped when the block ends, read to its end or not (a cancel drops it
    too). :class:`ExchangeLost` when the upstream cannot be reached or breaks."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    target = parts.path.rstrip("/") + path
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        raise ExchangeLost(_why(exc)) from exc
    try:
        conn = h11.Connection(h11.CLIENT)
        fields = [
            ("Host", parts.netloc),
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream"),
            ("Content-Length", str(len(body))),
            *headers.items(),
        ]
        request = h11.Request(method="POST", target=target, headers=fields)
        writer.write(conn.send(request) + (conn.send(h11.Data(data=body)) or b""))
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        exchange = Exchange(
            reader, writer, conn, await _head(reader, conn, read_timeout), read_timeout
        )
        yield exchange
    finally:
        writer.close()


async def _head(
    reader: asyncio.StreamReader, conn: h11.Connection, read_timeout: float
) -> h11.Response:
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise ExchangeLost("it closed the connection before it answered")
            if event is h11.NEED_DATA:
                async with asyncio.timeout(read_timeout):
                    conn.receive_data(await reader.read(READ_SIZE))
    except (OSError, TimeoutError, h11.RemoteProtocolError) as exc:
        raise ExchangeLost(_why(exc)) from exc


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TimeoutError: it did not answer in time"
    return f"{type(exc).__name__}: {exc}"
