"""A real webhook receiver for the tests: an HTTP server on loopback (its own thread)
that records every delivery it is sent and answers with the statuses a test chooses
(``refuse``: how many deliveries get a ``503`` first; then ``200``)."""

from __future__ import annotations

import http.server
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
