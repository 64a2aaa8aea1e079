"""A real webhook receiver for the tests: an HTTP server on loopback (its own thread)
that records every delivery it is sent and answers with the statuses a test chooses
(``refuse``: how many deliveries get a ``503`` first; then ``200``); a dead one
(:class:`Dead`), which takes every connection and never answers; and a port that is not
HTTP (:class:`Babbler`)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.helpers import free_port


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: bytes
    answered: int  # the status this receiver answered
    at: float  # time.time() when it answered
    path: str = "/hook"

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    def __init__(
        self, port: int | None = None, refuse: int = 0, hold: threading.Event | None = None
    ) -> None:
        self.port = port or free_port()
        self.refuse = refuse
        self.hold = hold  # set: answer; until then every request waits (a slow receiver)
        self.waiting = 0  # requests held now
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if receiver.hold is not None:
                    with receiver._lock:
                        receiver.waiting += 1
                    receiver.hold.wait(60)
                with receiver._lock:
                    status = 503 if receiver.refuse > 0 else 200
                    receiver.refuse = max(0, receiver.refuse - 1)
                    receiver.deliveries.append(
                        Delivery(
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            status,
                            time.time(),
                            self.path,
                        )
                    )
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def accepted(self) -> list[Delivery]:
        return [d for d in self.received() if 200 <= d.answered < 300]

    def wait_for(self, done: Callable[[list[Delivery]], bool], timeout: float = 60) -> None:
        """Wait until ``done(deliveries)``; fail (not a timing assertion: a guard against
        a hang) if it never comes."""
        deadline = time.monotonic() + timeout
        while not done(self.received()):
            if time.monotonic() > deadline:
                raise AssertionError(f"deliveries never came: {self.received()}")
            time.sleep(0.02)


class Dead:
    """A receiver that never answers: it accepts every connection and holds it open,
    reading nothing and sending nothing, until :meth:`stop`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.accepted = 0  # connections taken so far
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Dead:
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=1024)
        threading.Thread(target=self._take, args=(self._listener,), daemon=True).start()
        return self

    def _take(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # stopped
                return
            with self._lock:
                self._held.append(conn)
                self.accepted += 1

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept (Linux)
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._held:
                conn.close()
            self._held.clear()


class Babbler:
    """A port that speaks something else than HTTP: a banner, then it hangs up."""

    def __init__(self) -> None:
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def verify(delivery: Delivery, secret: str) -> dict[str, Any]:
    """Check a delivery's signature with both official verifiers: the
    ``standardwebhooks`` library and the ``openai`` SDK's ``client.webhooks.unwrap``;
    returns the event."""
    from openai import OpenAI
    from standardwebhooks.webhooks import Webhook

    event: dict[str, Any] = Webhook(secret).verify(delivery.body, delivery.headers)
    unwrapped = OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1").webhooks.unwrap(
        delivery.body, delivery.headers, secret=secret
    )
    assert unwrapped.id == event["id"] == delivery.webhook_id
    assert unwrapped.type == event["type"]
    assert unwrapped.data.id == event["data"]["id"]
    return event
