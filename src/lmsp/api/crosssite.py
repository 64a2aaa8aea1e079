"""The routes that need no token refuse what a web page could send them.

Requesting a pairing, polling for its token and signing in to the console take no
token (the caller has none yet). A page on any web site can make the browser send a
*simple* request (``Content-Type: text/plain``, no preflight) to ``127.0.0.1``: 63 of
them filled the pending pairings and locked real agents out for ten minutes. So these
routes take only ``application/json`` (a type a page can send cross-site only after a
CORS preflight, which lmsp never grants), ``415 unsupported_media_type`` otherwise (a
body-less poll passes), and refuse a browser's cross-site request outright
(``403 cross_site_request``): a ``Sec-Fetch-Site`` other than ``same-origin`` or
``none`` (a typed address), or an ``Origin`` other than the one the request came to
(its ``Host``, which :class:`lmsp.api.hosts.RequestGate` checked). Agents and
``curl`` send neither header.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from lmsp import errors
from lmsp.api.errors import error_response

#: ``(method, path)`` of the routes that take no token
OPEN_ROUTES = (
    ("POST", re.compile(r"/v1/pairing/?")),
    ("POST", re.compile(r"/v1/pairing/[^/]+/token/?")),
    ("POST", re.compile(r"/console/session/?")),
)
SAME_SITE = frozenset({"same-origin", "none"})


def is_open(method: str, path: str) -> bool:
    return any(method == m and pattern.fullmatch(path) for m, pattern in OPEN_ROUTES)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def problem(scope: Scope) -> errors.LmspError | None:
    """Why a request to a route that takes no token is refused (``None``: it is not)."""
    refused = cross_site(scope)
    if refused is not None:
        return refused
    kind = _header(scope, b"content-type")
    length = _header(scope, b"content-length")
    empty = length in (None, "0") and _header(scope, b"transfer-encoding") is None
    if kind is None and empty:  # a poll with no body (nothing for a page to smuggle)
        return None
    media = (kind or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        return errors.LmspError(
            "unsupported_media_type",
            "This route takes a JSON body: send Content-Type: application/json.",
        )
    return None


def cross_site(scope: Scope) -> errors.LmspError | None:
    """A browser's request from another site (``Sec-Fetch-Site``) or another origin
    (``Origin`` other than the ``Host`` it came to): also how a WebSocket upgrade, which
    a page may open to any address, is checked (:mod:`lmsp.api.websocket`)."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site.strip().lower() not in SAME_SITE:
        return errors.LmspError(
            "cross_site_request",
            f"A browser sent this request from another site (Sec-Fetch-Site: {site});"
            " this route is for agents on this machine.",
        )
    origin = _header(scope, b"origin")
    if origin is not None:
        host = (_header(scope, b"host") or "").strip().lower()
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not host or parts.netloc != host:
            return errors.LmspError(
                "cross_site_request",
                f"A browser sent this request from another origin ({origin});"
                " this route is for agents on this machine.",
            )
    return None


class CrossSiteGate:
    """ASGI middleware: the checks of :func:`problem` on the routes that take no token
    (before :class:`lmsp.api.app.BodyGate` reads every body as JSON)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_open(scope["method"], str(scope.get("path", ""))):
            refused = problem(scope)
            if refused is not None:
                await error_response(refused, str(scope.get("path", "")))(scope, receive, send)
                return
        await self.app(scope, receive, send)
