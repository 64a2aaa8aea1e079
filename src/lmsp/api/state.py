"""What only the HTTP face keeps, beside the running service (:mod:`lmsp.app`): the
console's sessions, the token cache and the recent refusals. Built with the app
(:func:`lmsp.api.app.create_app`), kept at ``app.state.http``."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from lmsp.api.eventstream import OpenStreams
from lmsp.api.refusals import Refusals
from lmsp.api.sessions import ConsoleSessions
from lmsp.api.tokens import TokenCache
from lmsp.app.service import Service


@dataclass
class Http:
    #: tokens checked without a database round trip per request
    tokens: TokenCache
    #: the console's login links and sessions (in memory: a restart ends them)
    console: ConsoleSessions = field(default_factory=ConsoleSessions)
    #: the recent 4xx/5xx answers, for ``lmsp logs --errors``
    refusals: Refusals = field(default_factory=Refusals)
    #: the event streams being written (ended at once when the server stops)
    streams: OpenStreams = field(default_factory=OpenStreams)


def service(request: HTTPConnection) -> Service:
    """The running service a request is served by."""
    svc: Service = request.app.state.lmsp
    return svc


def http(request: HTTPConnection) -> Http:
    """What the HTTP face keeps beside it."""
    kept: Http = request.app.state.http
    return kept
