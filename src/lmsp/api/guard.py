"""Slow, surplus and oversized requests: read deadlines, a connection limit and a cap
on the request head, for either HTTP parser uvicorn can use.

uvicorn reads requests with no deadline and no limit on the head: a client that sends
one header line every few seconds, or a body one byte at a time, holds its connection
(and a file descriptor) forever; one that sends a megabyte of headers, or twenty
thousand of them, has them all parsed and kept (httptools buffers a header however
long it grows; h11 answers ``400`` past 16 KiB). This module gives uvicorn a protocol
class (its ``http`` setting) that adds, per connection:

- **a header deadline**: the request line and headers must arrive within
  ``header_timeout`` seconds of the connection opening (or of the first byte of the
  next request on a kept-alive connection); else ``408`` and the connection is closed;
- **a head cap**: a request line and headers still incomplete after
  ``max_header_bytes`` bytes are answered ``431`` (``request_header_too_large``) and
  the connection is closed: the parser never holds more than that plus one read. A
  complete head over the cap, or with more than the allowed number of fields, is
  refused with the same ``431`` by :class:`lmsp.api.hosts.RequestGate`, which sees
  the parsed head whichever parser made it;
- **a body deadline**: the whole body within ``body_timeout`` seconds after the
  headers; else ``408`` and the connection is closed (the handler sees a disconnect);
- **a connection limit**: past ``max_connections`` open connections, a new one evicts
  the oldest connection that is not inside a request (still sending its headers, or
  idle between requests); when every connection is busy with a request, the new one is
  answered ``503`` with ``Retry-After`` and closed. A flood of slow clients thus costs
  at most ``max_connections`` descriptors and cannot lock out a client that talks
  promptly, such as a ``/healthz`` probe.

uvicorn's own knobs do not cover this: ``h11_max_incomplete_event_size`` bounds an
incomplete head for h11 only (and answers ``400``), httptools has no limit at all, and
``limit_concurrency`` answers ``503`` to newcomers instead of evicting idle connections.
The h11 class below sets h11's limit to ``max_header_bytes`` and turns its refusal into
the ``431``.

The parser is httptools when it is installed (as uvicorn's ``auto`` picks it, and
``uvicorn[standard]`` installs it), else h11; ``LMSP_HTTP`` chooses one. Both get the
same guard: :class:`_Guard` holds it, and each parser's class tells it when a head
begins, when it is complete, when the body is, and when the answer has gone.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any, ClassVar

IMPLEMENTATIONS = ("auto", "httptools", "h11")


def _raw_error(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"type": kind, "code": code, "message": message, "param": None}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
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


def head_too_large(limit: int) -> bytes:
    return _raw_error(
        431,
        "Request Header Fields Too Large",
        "request_header_too_large",
        f"The request line and headers exceed {limit} bytes.",
    )


class _Guard(asyncio.Protocol):
    """The deadlines, the limit and the head cap, on top of one of uvicorn's protocol
    classes (next in the method order: it provides the attributes declared here).
    :func:`guarded_protocol` makes a subclass per server, with its own settings and
    registry."""

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 1000
    max_header_bytes: ClassVar[int] = 64 * 1024
    # connections not inside a request, oldest first: the ones a newcomer may evict
    idle: ClassVar[dict[Any, None]]
    # counters, for tests and logs
    stats: ClassVar[dict[str, int]]

    # provided by uvicorn's protocol class
    transport: Any
    loop: Any
    connections: Any
    cycle: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._between = False  # a response went out; no byte of the next request yet
        self._head_bytes = 0  # bytes read of a head not complete yet
        self._in_head = True
        self._upgraded = False  # the connection became a WebSocket

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
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

    # -- the request's course ----------------------------------------------------------------
    def _head_begun(self) -> None:
        self._between = False
        if self._deadline is None:
            self._await_headers()

    def _count_head(self, size: int) -> None:
        if self._in_head:
            self._head_bytes += size

    def _head_over(self) -> bool:
        """After a read: the head is still incomplete and past the cap (then refused)."""
        if not (self._in_head and self._head_bytes > self.max_header_bytes):
            return False
        self.stats["heads_too_large"] += 1
        self._close_with(head_too_large(self.max_header_bytes))
        return True

    def _head_done(self, body_follows: bool = True) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm()
        self.idle.pop(self, None)
        if body_follows and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.body_timeout, self._body_late)

    def _body_done(self) -> None:
        self._disarm()
        self._in_head = True

    def _answered(self, pipelined: bool) -> None:
        if not self.transport.is_closing() and not pipelined:
            self._between = True
            self.idle[self] = None  # between requests: uvicorn's keep-alive timer runs

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """An upgrade to a WebSocket: no HTTP deadline applies to the socket any more
        (its own limits do: :mod:`lmsp.api.websocket`). Before, h11's body deadline
        fired into the upgraded socket and wrote a raw ``408`` into its frames."""
        self._upgraded = True
        self._disarm()
        self.idle.pop(self, None)
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

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


def _httptools_class() -> type[Any]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(_Guard, HttpToolsProtocol):
        """httptools: its parser callbacks say where the request is."""

        def data_received(self, data: bytes) -> None:
            self._count_head(len(data))
            super().data_received(data)
            self._head_over()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_begun()

        def on_headers_complete(self) -> None:
            self._head_done(body_follows=False)
            super().on_headers_complete()
            if not self.transport.is_closing() and not self._upgraded:
                self._deadline = self.loop.call_later(self.body_timeout, self._body_late)

        def on_message_complete(self) -> None:
            self._body_done()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._answered(bool(self.pipeline))

    return GuardedHttpTools


def _h11_class() -> type[Any]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTooLarge(Exception):
        """h11's own refusal of a long head, carried past uvicorn's ``400``."""

    class Connection(h11.Connection):
        def next_event(self) -> Any:
            try:
                return super().next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    raise HeadTooLarge from exc
                raise

    class GuardedH11(_Guard, H11Protocol):
        """h11: the state of the other side (``their_state``) says where the request
        is, read after each batch of events; h11 itself stops buffering a head past
        the cap."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = Connection(h11.SERVER, max_incomplete_event_size=self.max_header_bytes)
            self._phase = "head"

        def data_received(self, data: bytes) -> None:
            if self._phase == "head" and self.conn.their_state is h11.IDLE:
                self._head_begun()
            self._count_head(len(data))
            super().data_received(data)
            if not self.transport.is_closing():
                self._head_over()

        def handle_events(self) -> None:
            try:
                super().handle_events()
            except HeadTooLarge:
                self.stats["heads_too_large"] += 1
                self._close_with(head_too_large(self.max_header_bytes))
                return
            if self._upgraded:  # the socket's own protocol reads from now on
                return
            state = self.conn.their_state
            if self._phase == "head" and state is not h11.IDLE:
                self._phase = "body" if state is h11.SEND_BODY else "done"
                self._head_done(body_follows=state is h11.SEND_BODY)
            if self._phase == "body" and state is not h11.SEND_BODY:
                self._phase = "done"
                self._body_done()

        def on_response_complete(self) -> None:
            self._answered(False)
            self._phase = "head"
            self._in_head = True
            super().on_response_complete()

    return GuardedH11


def implementation(wanted: str = "auto") -> str:
    """The parser to use: ``wanted``, or for ``auto`` httptools when installed."""
    if wanted not in IMPLEMENTATIONS:
        raise ValueError(f"LMSP_HTTP must be one of {IMPLEMENTATIONS}")
    if wanted == "auto":
        return "httptools" if importlib.util.find_spec("httptools") else "h11"
    return wanted


def guarded_protocol(
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    max_header_bytes: int = 64 * 1024,
    http: str = "auto",
) -> type[Any]:
    """A guarded protocol class for one server (its own limits and registry), on the
    parser ``http`` names (``auto``, ``httptools`` or ``h11``)."""
    base = _httptools_class() if implementation(http) == "httptools" else _h11_class()
    return type(
        "LmspHttpProtocol",
        (base,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
            "max_header_bytes": max_header_bytes,
            "idle": {},
            "stats": {
                "refused": 0,
                "evicted": 0,
                "header_timeouts": 0,
                "body_timeouts": 0,
                "heads_too_large": 0,
            },
        },
    )
