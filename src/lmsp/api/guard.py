"""Slow and surplus connections: header and body read timeouts and a connection limit.

uvicorn reads requests with no deadline: a client that sends one header line every few
seconds, or a body one byte at a time, holds its connection (and a file descriptor)
forever, and enough of them make the service unreachable. This module gives uvicorn a
protocol class (its ``http`` setting) that adds, per connection:

- **a header deadline**: the request line and headers must arrive within
  ``header_timeout`` seconds of the connection opening (or of the first byte of the
  next request on a kept-alive connection); else ``408`` and the connection is closed;
- **a body deadline**: the whole body within ``body_timeout`` seconds after the
  headers; else ``408`` and the connection is closed (the handler sees a disconnect);
- **a connection limit**: past ``max_connections`` open connections, a new one evicts
  the oldest connection that is not inside a request (still sending its headers, or
  idle between requests); when every connection is busy with a request, the new one is
  answered ``503`` with ``Retry-After`` and closed. A flood of slow clients thus costs
  at most ``max_connections`` descriptors and cannot lock out a client that talks
  promptly, such as a ``/healthz`` probe.

The class builds on uvicorn's httptools protocol (uvicorn[standard]).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _raw_error(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = json.dumps(
        {"error": {"type": kind, "code": code, "message": message, "param": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


TIMEOUT_HEADERS = _raw_error(
    408, "Request Timeout", "request_timeout", "The request headers took too long to arrive."
)
TIMEOUT_BODY = _raw_error(
    408, "Request Timeout", "request_timeout", "The request body took too long to arrive."
)
TOO_MANY = _raw_error(
    503,
    "Service Unavailable",
    "too_many_connections",
    "The service has as many connections open as it allows; retry shortly.",
    "retry-after: 1\r\n",
)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines and a connection limit. Use
    :func:`guarded_protocol` to get a subclass configured for one server."""

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 1000
    # connections not inside a request, oldest first: the ones a newcomer may evict
    idle: ClassVar[dict[GuardedProtocol, None]]
    # counters, for tests and logs
    stats: ClassVar[dict[str, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._between = False  # a response went out; no byte of the next request yet

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            victim = next(iter(self.idle), None)
            if victim is None:
                self.stats["refused"] += 1
                self._close_with(TOO_MANY)
                return
            self.stats["evicted"] += 1
            victim._close_with(b"" if victim._between else TIMEOUT_HEADERS)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.idle.pop(self, None)
        super().connection_lost(exc)

    # -- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._between = False
        if self._deadline is None:
            self._await_headers()

    def on_headers_complete(self) -> None:
        self._disarm()
        self.idle.pop(self, None)
        super().on_headers_complete()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.body_timeout, self._body_late)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._between = True
            self.idle[self] = None  # between requests: uvicorn's keep-alive timer runs

    # -- deadlines ---------------------------------------------------------------------------
    def _await_headers(self) -> None:
        self._disarm()
        self.idle[self] = None
        self._deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        self.stats["header_timeouts"] += 1
        self._close_with(TIMEOUT_HEADERS)

    def _body_late(self) -> None:
        self._deadline = None
        self.stats["body_timeouts"] += 1
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        self._close_with(TIMEOUT_BODY)

    def _close_with(self, answer: bytes) -> None:
        self._disarm()
        self.idle.pop(self, None)
        if self.transport.is_closing():
            return
        if self.cycle is not None:
            self.cycle.disconnected = True  # the handler's own answer is dropped
        if answer:
            self.transport.write(answer)
        self.transport.close()


def guarded_protocol(
    header_timeout: float, body_timeout: float, max_connections: int
) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` subclass for one server (its own limits and registry)."""
    return type(
        "LmspHttpProtocol",
        (GuardedProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
            "idle": {},
            "stats": {"refused": 0, "evicted": 0, "header_timeouts": 0, "body_timeouts": 0},
        },
    )
