"""Which URLs lmsp may call out to, pure: webhook receivers (``LMSP_WEBHOOK_HOSTS``) and
MCP servers (``LMSP_MCP_HOSTS``) follow one rule.

``http`` or ``https`` only, with a host and nothing else in its authority (no
``user:password@``). The host must be a loopback address (``127.0.0.0/8``, ``::1``,
an IPv4-mapped loopback) or ``localhost``, unless the setting lists it: ``host`` (any
port) or ``host:port`` (that port only), comma-separated; ``*`` allows any host except
the link-local ones (``169.254.0.0/16``, ``fe80::/10``: a cloud's metadata service lives
there), which only an exact entry allows. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

#: the longest URL lmsp calls out to
MAX_URL = 2048


class InvalidUrl(ValueError):
    """A URL lmsp may not call; the message says why (clients read it)."""


@dataclass(frozen=True)
class HostRule:
    host: str  # lower case, no brackets; "*" for any
    port: int | None  # None: any port


def parse_hosts(value: str, setting: str) -> tuple[HostRule, ...]:
    """``host[:port]`` entries, comma-separated (``[v6]:port`` for an IPv6 address with a
    port); ``ValueError`` naming ``setting`` for a malformed entry."""
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
            raise ValueError(f"{setting}: {raw.strip()!r} is not host[:port]")
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


def loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    address = _ip(host)
    return address is not None and address.is_loopback


def _parts(url: str, what: str) -> tuple[SplitResult, str, int]:
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
        raise InvalidUrl(f"A {what} URL must be http:// or https://.")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise InvalidUrl("The URL has no host.")
    if parts.username is not None or parts.password is not None:
        raise InvalidUrl(f"A {what} URL may not carry credentials (user:password@).")
    return parts, host, port or (443 if parts.scheme == "https" else 80)


def check_url(url: str, rules: tuple[HostRule, ...], what: str, setting: str) -> str:
    """``url`` if lmsp may call it under ``rules`` (from ``setting``), else
    :class:`InvalidUrl` saying why (``what``: the kind of URL, for the message)."""
    _, host, port = _parts(url, what)
    if loopback(host):
        return url
    for rule in rules:
        if rule.host == host and rule.port in (None, port):
            return url
    address = _ip(host)
    link_local = address is not None and address.is_link_local
    if not link_local and any(rule.host == "*" for rule in rules):
        return url
    why = "a link-local address (a metadata service's)" if link_local else f"not in {setting}"
    raise InvalidUrl(
        f"The URL's host {host!r} is {why}: a {what} URL names this machine (loopback)"
        f" unless the operator lists more hosts in {setting}."
    )


def allows(url: str, rules: tuple[HostRule, ...]) -> bool:
    """Whether :func:`check_url` takes ``url``."""
    try:
        check_url(url, rules, "", "")
    except InvalidUrl:
        return False
    return True
