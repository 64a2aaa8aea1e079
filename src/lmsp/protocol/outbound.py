"""Which URLs lmsp may call out to, and which addresses it may connect to for them, pure:
webhook receivers (``LMSP_WEBHOOK_HOSTS``) and MCP servers (``LMSP_MCP_HOSTS``) follow
one rule.

``http`` or ``https`` only, with a host and nothing else in its authority (no
``user:password@``). The host must be this machine's loopback — an address in
``127.0.0.0/8``, ``::1`` or an IPv4-mapped loopback, or the name ``localhost`` (or a
name under ``.localhost``), which must then resolve to loopback — unless the setting
lists it: ``host`` (any port) or ``host:port`` (that port only), comma-separated; ``*``
allows any host except the link-local ones (``169.254.0.0/16``, ``fe80::/10``: a
cloud's metadata service lives there), which only an exact entry allows.

A host is read as the resolver reads it: every numeric form ``inet_aton`` takes
(``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) is the address it names,
and an IPv6 address carrying an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is
link-local if that one is. :func:`check_url` judges a URL as written (when it is
stored, and before each use); :func:`admits` judges each address a host resolved to,
where the connection is made (``lmsp.outbound.guard``), so a name cannot lead to an
address its URL could not name. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

#: the longest URL lmsp calls out to
MAX_URL = 2048

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class InvalidUrl(ValueError):
    """A URL lmsp may not call; the message says why (clients read it)."""


@dataclass(frozen=True)
class HostRule:
    host: str  # lower case, no brackets, an address in its usual form; "*" for any
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
        rules.append(HostRule(canonical(host.rstrip(".")), port))
    return tuple(rules)


# -- numeric hosts ----------------------------------------------------------------------------
_PART = re.compile(r"0x[0-9a-f]+|0[0-7]*|[1-9][0-9]*")
#: four decimal parts: HTTP clients take such a host for a dotted IPv4 address, or refuse it
_DOTTED = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` names in one of ``inet_aton``'s forms (one to four
    parts, each decimal, ``0x`` hex or ``0`` octal; the last fills the bytes left), or
    ``None``."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_PART.fullmatch(p) for p in parts):
        return None
    values = [int(p, 16) if p.startswith("0x") else int(p, 8 if p[0] == "0" else 10) for p in parts]
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = last
    for index, value in enumerate(head):
        number += value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _plain_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def address(host: str) -> Address | None:
    """The address ``host`` (lower case, no brackets) names as a number the resolver
    takes, IPv4-mapped IPv6 as its IPv4 address; ``None`` for a name."""
    try:
        found: Address = ipaddress.ip_address(host)
    except ValueError:
        return _inet_aton(host)
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def canonical(host: str) -> str:
    """``host`` as rules compare it: an address in its usual form, a name in ASCII (the
    IDNA form a connection names it by)."""
    found = address(host)
    if found is not None:
        return str(found)
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def _carried(found: Address) -> list[Address]:
    """``found`` and every IPv4 address an IPv6 one carries (a packet to it may reach)."""
    if isinstance(found, ipaddress.IPv4Address):
        return [found]
    carried: list[Address] = [found]
    if found.ipv4_mapped is not None:
        carried.append(found.ipv4_mapped)
    if found.sixtofour is not None:
        carried.append(found.sixtofour)
    if found.teredo is not None:
        carried += list(found.teredo)
    low = ipaddress.IPv4Address(int(found) & 0xFFFFFFFF)
    if int(found) >> 32 == 0 or found in _NAT64:  # IPv4-compatible, NAT64
        carried.append(low)
    return carried


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def link_local(found: Address) -> bool:
    """Whether ``found`` is, or carries, a link-local address."""
    return any(a.is_link_local for a in _carried(found))


def loopback_address(found: Address) -> bool:
    """Whether a connection to ``found`` stays on this machine's loopback."""
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped.is_loopback
    return found.is_loopback


def loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, in any numeric form) is this machine's
    loopback: a loopback address, or ``localhost`` or a name under it (a connection
    still goes only to the loopback addresses such a name resolves to: :func:`admits`)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    found = address(host)
    return found is not None and loopback_address(found)


# -- the rule ---------------------------------------------------------------------------------
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
    if _DOTTED.fullmatch(host) and not _plain_ipv4(host):
        raise InvalidUrl(
            f"The URL's host {host!r} is no IPv4 address (a part over 255, or a leading"
            " zero, which some read as octal and others as decimal)."
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidUrl(f"A {what} URL may not carry credentials (user:password@).")
    return parts, host, port or (443 if parts.scheme == "https" else 80)


def _listed(host: str, port: int, rules: tuple[HostRule, ...]) -> bool:
    return any(rule.host == host and rule.port in (None, port) for rule in rules)


def check_url(url: str, rules: tuple[HostRule, ...], what: str, setting: str) -> str:
    """``url`` if lmsp may call it under ``rules`` (from ``setting``), else
    :class:`InvalidUrl` saying why (``what``: the kind of URL, for the message)."""
    _, host, port = _parts(url, what)
    if loopback(host) or _listed(canonical(host), port, rules):
        return url
    found = address(host)
    near = found is not None and link_local(found)
    if not near and any(rule.host == "*" for rule in rules):
        return url
    why = "a link-local address (a metadata service's)" if near else f"not in {setting}"
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


def admits(host: str, port: int, resolved: str, rules: tuple[HostRule, ...]) -> bool:
    """Whether lmsp may connect to ``resolved`` (an address ``host`` resolved to) for a
    URL on ``host:port`` that :func:`check_url` took: a loopback address always; another
    if an exact entry lists the host or that address; under ``*`` any address but a
    link-local one. A name under ``localhost`` that resolves elsewhere gets nothing."""
    target = address(resolved.lower())
    if target is None:
        return False
    if loopback_address(target):
        return True
    if _listed(canonical(host.rstrip(".").lower()), port, rules) or _listed(
        str(target), port, rules
    ):
        return True
    return not link_local(target) and any(rule.host == "*" for rule in rules)
