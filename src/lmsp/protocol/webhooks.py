"""Webhooks on the wire (PROTOCOL.md section 9), pure: the events a webhook may ask for,
the event body OpenAI's webhooks send, which URLs a webhook may name, and the retry
schedule. Nothing here does I/O.

**URLs.** The rule of :mod:`lmsp.protocol.outbound` under ``LMSP_WEBHOOK_HOSTS``
(loopback unless listed; ``*`` any host but link-local ones). The check is made when the
webhook is created and again before every delivery (the operator may have narrowed the
list since).
"""

from __future__ import annotations

import json
from typing import Any

from lmsp.protocol import outbound
from lmsp.protocol.outbound import MAX_URL, HostRule, InvalidUrl

__all__ = ["MAX_URL", "HostRule", "InvalidUrl", "check_url", "parse_hosts"]

#: what a webhook may hear: a response's end, whatever API created it
EVENTS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")

HOSTS_SETTING = "LMSP_WEBHOOK_HOSTS"
#: the longest one delay between two tries (the delays double from ``LMSP_WEBHOOK_RETRY``)
MAX_DELAY = 3600.0


def event_body(event_id: str, event_type: str, created_at: int, response_id: str) -> bytes:
    """The body of a delivery: OpenAI's webhook event (``client.webhooks.unwrap`` parses
    it). The same bytes on every try."""
    event = {
        "object": "event",
        "id": event_id,
        "type": event_type,
        "created_at": created_at,
        "data": {"id": response_id},
    }
    return json.dumps(event, separators=(",", ":")).encode()


def parse_hosts(value: str) -> tuple[HostRule, ...]:
    """``LMSP_WEBHOOK_HOSTS``: ``host[:port]`` entries (:mod:`lmsp.protocol.outbound`)."""
    return outbound.parse_hosts(value, HOSTS_SETTING)


def check_url(url: str, rules: tuple[HostRule, ...]) -> str:
    """``url`` if a webhook may name it under ``rules`` (``LMSP_WEBHOOK_HOSTS``), else
    :class:`InvalidUrl` saying why."""
    return outbound.check_url(url, rules, "webhook", HOSTS_SETTING)


def next_delay(tries: int, first: float) -> float:
    """The wait after the ``tries``-th failed try: ``first``, then doubling, at most
    :data:`MAX_DELAY`."""
    return float(min(first * (2 ** max(0, tries - 1)), MAX_DELAY))


def describe(value: Any) -> str:
    """A short, single-line account of a failure for the deliveries list."""
    text = " ".join(str(value).split())
    return text if len(text) <= 300 else text[:297] + "..."
