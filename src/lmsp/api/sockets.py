"""The open WebSockets of this process: admitted per client (at most
``LMSP_WS_PER_CLIENT`` each, so one client's sockets cannot take every connection the
server allows), counted for ``/metrics`` and listed by ``/v1/service/activity``.

HTTP-only state: it lives with the app (``app.state``), not in the service.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lmsp.errors import LmspError

#: why sockets closed (the ``reason`` label)
REASONS = ("client", "idle", "max_age", "slow_reader", "revoked", "server")


@dataclass
class OpenSocket:
    id: int
    client_id: str
    opened_at: float = field(default_factory=time.time)
    turns: int = 0
    #: the response being streamed (``None`` between turns)
    response_id: str | None = None
    cached_bytes: int = 0


class Sockets:
    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self.open: dict[int, OpenSocket] = {}
        self.opened = 0
        self.refused = 0
        self.turns = 0
        self.closed: Counter[str] = Counter()
        self._ids = itertools.count(1)

    def admit(self, client_id: str) -> OpenSocket:
        """A new socket of ``client_id``, or ``429 too_many_websockets`` past its limit."""
        held = sum(1 for s in self.open.values() if s.client_id == client_id)
        if held >= self.per_client:
            self.refused += 1
            raise LmspError(
                "too_many_websockets",
                f"This client has {held} WebSockets open, as many as one client may"
                f" (LMSP_WS_PER_CLIENT, {self.per_client}); close one, or run turns one"
                " after another on one socket.",
            )
        socket = OpenSocket(next(self._ids), client_id)
        self.open[socket.id] = socket
        self.opened += 1
        return socket

    def release(self, socket: OpenSocket, reason: str) -> None:
        if self.open.pop(socket.id, None) is not None:
            self.closed[reason] += 1

    def activity(self) -> dict[str, Any]:
        """What ``/v1/service/activity`` shows: each socket's client, age and turn."""
        return {
            "open": len(self.open),
            "sockets": [
                {
                    "client_id": s.client_id,
                    "opened_at": int(s.opened_at),
                    "turns": s.turns,
                    "response_id": s.response_id,
                    "cached_bytes": s.cached_bytes,
                }
                for s in self.open.values()
            ],
        }

    def figures(self) -> list[Metric]:
        now_open = GaugeMetricFamily("lmsp_websockets_open", "WebSockets open now.")
        now_open.add_metric([], len(self.open))
        busy = GaugeMetricFamily(
            "lmsp_websockets_streaming", "WebSockets streaming a turn's events now."
        )
        busy.add_metric([], sum(1 for s in self.open.values() if s.response_id is not None))
        opened = CounterMetricFamily("lmsp_websockets_opened", "WebSockets accepted.")
        opened.add_metric([], self.opened)
        refused = CounterMetricFamily(
            "lmsp_websockets_refused", "WebSocket upgrades refused for a client's limit."
        )
        refused.add_metric([], self.refused)
        turns = CounterMetricFamily("lmsp_websocket_turns", "response.create turns run.")
        turns.add_metric([], self.turns)
        closed = CounterMetricFamily(
            "lmsp_websockets_closed", "WebSockets closed, by why.", labels=["reason"]
        )
        for reason in REASONS:
            closed.add_metric([reason], self.closed.get(reason, 0))
        return [now_open, busy, opened, refused, turns, closed]
