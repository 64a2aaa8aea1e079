"""Outbound connections under the hosts rule: every TCP connection lmsp opens to a
webhook receiver or an MCP server goes to an address
:func:`lmsp.protocol.outbound.admits` takes for the host of its URL.

The host is resolved here, once, and each address it resolved to is judged before a
connection is made to that very address: a name cannot lead where its URL could not (a
numeric form the resolver reads, a ``.localhost`` name that resolves elsewhere, an
answer that changed since the URL was checked — DNS rebinding). A host none of whose
addresses is admitted fails as a connection error that names the addresses.

httpx takes no resolver: the guard is its connection pool's network backend (httpcore's,
and httpcore2's under the ``httpx2`` client the MCP SDK uses). The clients made here
take no proxy from the environment (a proxy would connect in lmsp's place) and follow no
redirect.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from lmsp.protocol import outbound
from lmsp.protocol.outbound import HostRule

if TYPE_CHECKING:
    import httpx
    import httpx2

#: ``(host, port)`` → the addresses it resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system's resolver), in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class Guard:
    """A network backend that connects only to admitted addresses (``errors``: the
    library's connect error and connect timeout, raised for a refusal)."""

    def __init__(
        self,
        inner: Any,
        rules: tuple[HostRule, ...],
        errors: tuple[type[Exception], type[Exception]],
        resolver: Resolver,
    ) -> None:
        self.inner = inner
        self.rules = rules
        self.errors = errors
        self.resolver = resolver

    async def admitted(self, host: str, port: int, timeout: float | None) -> list[str]:
        """The addresses ``host`` resolves to that lmsp may connect to, or the
        library's connect error saying why there is none."""
        refused = self.errors[0]
        try:
            async with asyncio.timeout(timeout):
                found = await self.resolver(host, port)
        except (OSError, TimeoutError) as exc:
            raise refused(f"{host} did not resolve ({exc or type(exc).__name__})") from None
        admitted = [a for a in found if outbound.admits(host, port, a, self.rules)]
        if not admitted:
            raise refused(
                f"{host} resolves to {', '.join(found) or 'no address'}, none of which"
                " lmsp may connect to (the hosts allowed)"
            )
        return admitted

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> Any:
        *others, last = await self.admitted(host, port, timeout)
        for address in others:  # the next address when one does not connect
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except self.errors:
                continue
        return await self.inner.connect_tcp(last, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> Any:
        raise self.errors[0]("lmsp connects out over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def _guard_pool(pool: Any, guard: Guard) -> None:
    """Put ``guard`` in front of ``pool``'s network backend (no public way to give
    httpx's pool a backend: its constructor takes none)."""
    if not hasattr(pool, "_network_backend"):  # pragma: no cover - a new httpcore
        raise RuntimeError("httpcore's connection pool has no network backend to guard")
    guard.inner = pool._network_backend
    pool._network_backend = guard


def transport(
    rules: tuple[HostRule, ...],
    limits: httpx.Limits | None = None,
    resolver: Resolver = resolve,
) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose every connection passes the hosts rule ``rules``
    (``limits``: httpx's default if ``None``)."""
    import httpcore
    import httpx

    made = httpx.AsyncHTTPTransport() if limits is None else httpx.AsyncHTTPTransport(limits=limits)
    errors = (httpcore.ConnectError, httpcore.ConnectTimeout)
    _guard_pool(cast(Any, made)._pool, Guard(None, rules, errors, resolver))
    return made


def client(
    rules: tuple[HostRule, ...],
    timeout: httpx.Timeout,
    headers: dict[str, str],
    limits: httpx.Limits | None = None,
    resolver: Resolver = resolve,
) -> httpx.AsyncClient:
    """An httpx client under ``rules``: no proxy, no redirect followed."""
    import httpx

    return httpx.AsyncClient(
        transport=transport(rules, limits, resolver),
        timeout=timeout,
        headers=headers,
        follow_redirects=False,
    )


def client2(
    rules: tuple[HostRule, ...],
    timeout: httpx2.Timeout,
    headers: dict[str, str] | None,
    resolver: Resolver = resolve,
    wrap: Callable[[httpx2.AsyncBaseTransport], httpx2.AsyncBaseTransport] | None = None,
) -> httpx2.AsyncClient:
    """The same, as the ``httpx2`` client the MCP SDK takes (imported when first used,
    with the SDK); ``wrap``: a transport around the guarded one (the MCP client's
    byte count)."""
    import httpcore2
    import httpx2

    made = httpx2.AsyncHTTPTransport()
    errors = (httpcore2.ConnectError, httpcore2.ConnectTimeout)
    _guard_pool(cast(Any, made)._pool, Guard(None, rules, errors, resolver))
    transport = made if wrap is None else wrap(made)
    return httpx2.AsyncClient(
        transport=transport, timeout=timeout, headers=headers, follow_redirects=False
    )
