"""The checks every request passes before routing: its ``Host``, and its head's size.

**Host.** A page on any web site can make the browser resolve its own name to
``127.0.0.1`` (DNS rebinding) and then read what lmsp answers without a token on
loopback (``/metrics``) or reach pairing, as a page of that site. What gives it away is
the ``Host`` header: the browser sends the attacker's name. So lmsp answers only the
names it is reached by: the address it is bound to, ``localhost`` (and names under
``.localhost``, which resolve to loopback by definition), the loopback addresses, and
the names an operator adds (``LMSP_ALLOWED_HOSTS``, e.g. the machine's name when bound
beyond loopback); bound to a wildcard address (``0.0.0.0``, ``::``), any IP address
literal too (a rebinding page always has a name). Anything else is ``421
misdirected_request``. A request with no ``Host`` at all (HTTP/1.0) is not a browser's
and passes. The port is not compared: a name's port cannot be rebound.

**Head.** :mod:`lmsp.api.guard` stops reading a head that grows past
``max_header_bytes``; a head that arrived whole in one read is measured here (the
request line and every field, as sent), with the number of fields: over either limit
it is ``431 request_header_too_large``, whichever HTTP parser read it.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from lmsp import errors
from lmsp.api.errors import error_response

WILDCARDS = frozenset({"0.0.0.0", "::", ""})
#: every field costs its name, its value and ``": "`` and CRLF
FIELD_OVERHEAD = 4


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def host_name(header: str) -> str:
    """The name of a ``Host`` value: without its port, lower case, brackets kept off an
    IPv6 literal (``[::1]:8430`` → ``::1``), no trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostPolicy:
    """Which ``Host`` names the service answers (see the module's docstring)."""

    def __init__(self, bound: str, extra: tuple[str, ...] = ()) -> None:
        self.any_ip = bound in WILDCARDS
        names = {"localhost", "127.0.0.1", "::1", host_name(bound)}
        names.update(host_name(name) for name in extra if name.strip())
        self.names = frozenset(name for name in names if name)

    def allows(self, header: str) -> bool:
        name = host_name(header)
        if name in self.names or name.endswith(".localhost"):
            return True
        address = _ip(name)
        return address is not None and (self.any_ip or address.is_loopback)


class RequestGate:
    """ASGI middleware: refuse a foreign ``Host`` (421) and an oversized head (431)."""

    def __init__(
        self, app: ASGIApp, hosts: HostPolicy, max_header_bytes: int, max_headers: int
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # an upgrade's head is checked too
            await self.app(scope, receive, send)
            return
        problem = self.problem(scope)
        if problem is not None:
            await error_response(problem)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def problem(self, scope: Scope) -> errors.LmspError | None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if len(headers) > self.max_headers:
            return errors.LmspError(
                "request_header_too_large",
                f"The request has {len(headers)} header fields; at most {self.max_headers}"
                " are allowed.",
            )
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(name) + len(value) + FIELD_OVERHEAD for name, value in headers)
        if size > self.max_header_bytes:
            return errors.LmspError(
                "request_header_too_large",
                f"The request line and headers exceed {self.max_header_bytes} bytes.",
            )
        host = [value for name, value in headers if name == b"host"]
        if len(host) > 1:
            return errors.LmspError("misdirected_request", "The request has two Host headers.")
        if host and not self.hosts.allows(host[0].decode("latin-1")):
            return errors.LmspError(
                "misdirected_request",
                "This service does not answer for that Host name (LMSP_ALLOWED_HOSTS adds names).",
            )
        return None
