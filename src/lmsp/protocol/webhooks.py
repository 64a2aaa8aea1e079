"""Webhooks on the wire (PROTOCOL.md section 9), pure: the events a webhook may ask for,
the event body OpenAI's webhooks send, which URLs a webhook may name, and the retry
schedule. Nothing here does I/O.

**URLs.** ``http`` or ``https`` only, with a host and nothing else in its authority
(no ``user:password@``). The host must be a loopback address (``127.0.0.0/8``, ``::1``)
or ``localhost``, unless ``LMSP_WEBHOOK_HOSTS`` lists it: ``host`` (any port) or
``host:port`` (that port only), comma-separated; ``*`` allows any host except the
link-local ones (``169.254.0.0/16``, ``fe80::/10``: a cloud's metadata service lives
there), which only an exact entry allows. The check is made when the webhook is created
and again before every delivery (the operator may have narrowed the list since).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

#: what a webhook may hear: a response's end, whatever API created it
EVENTS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")

#: the longest URL a webhook may name
MAX_URL = 2048
#: the longest one delay between two tries (the delays double from ``LMSP_WEBHOOK_RETRY``)
MAX_DELAY = 3600.0


class InvalidUrl(ValueError):
    """A URL a webhook may not name; the message says why (clients read it)."""


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


@dataclass(frozen=True)
class HostRule:
    host: str  # lower case, no brackets; "*" for any
    port: int | None  # None: any port


def parse_hosts(value: str) -> tuple[HostRule, ...]:
    """``LMSP_WEBHOOK_HOSTS``: ``host[:port]`` entries, comma-separated (``[v6]:port``
    for an IPv6 address with a port); ``ValueError`` for a malformed entry."""
    rules: list[HostRule] = []
    for raw in value.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            rules.append(HostRule("*", None))
            continue
        try:
            parts = urlsplit(f"//{entry}")
            host, port = parts.hostname, parts.port
        except ValueError:
            host, port = None, None
        if not host or parts.path or parts.username is not None:
            raise ValueError(f"LMSP_WEBHOOK_HOSTS: {raw.strip()!r} is not host[:port]")
        rules.append(HostRule(host.rstrip("."), port))
    return tuple(rules)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    address = _ip(host)
    return address is not None and address.is_loopback


def _parts(url: str) -> tuple[SplitResult, str, int]:
    if len(url) > MAX_URL:
        raise InvalidUrl(f"The URL is longer than {MAX_URL} characters.")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise InvalidUrl("The URL contains white space or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidUrl(f"The URL cannot be parsed: {exc}.") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidUrl("A webhook URL must be http:// or https://.")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise InvalidUrl("The URL has no host.")
    if parts.username is not None or parts.password is not None:
        raise InvalidUrl("A webhook URL may not carry credentials (user:password@).")
    return parts, host, port or (443 if parts.scheme == "https" else 80)


def check_url(url: str, rules: tuple[HostRule, ...]) -> str:
    """``url`` if a webhook may name it under ``rules`` (``LMSP_WEBHOOK_HOSTS``), else
    :class:`InvalidUrl` saying why."""
    _, host, port = _parts(url)
    if _loopback(host):
        return url
    for rule in rules:
        if rule.host == host and rule.port in (None, port):
            return url
    address = _ip(host)
    link_local = address is not None and address.is_link_local
    if not link_local and any(rule.host == "*" for rule in rules):
        return url
    why = (
        "a link-local address (a metadata service's)"
        if link_local
        else "a host LMSP_WEBHOOK_HOSTS does not list"
    )
    raise InvalidUrl(
        f"The URL's host {host!r} is {why}: webhooks go to this machine (loopback) unless"
        " the operator lists more hosts in LMSP_WEBHOOK_HOSTS."
    )


def next_delay(tries: int, first: float) -> float:
    """The wait after the ``tries``-th failed try: ``first``, then doubling, at most
    :data:`MAX_DELAY`."""
    return float(min(first * (2 ** max(0, tries - 1)), MAX_DELAY))


def describe(value: Any) -> str:
    """A short, single-line account of a failure for the deliveries list."""
    text = " ".join(str(value).split())
    return text if len(text) <= 300 else text[:297] + "..."
