"""The console's sign-in: one-time login links and browser sessions, in memory.

``lmsp console`` (or the ``serve`` banner) asks for a login link: a random code, good
once and for :data:`LINK_TTL` seconds, carried in the link's fragment
(``/console/login#code=…``), which a browser never sends to any server. The page that
opens spends the code (``POST /console/session``) for a session secret that stands for
the client that asked for the link (the owner), for :data:`SESSION_TTL` seconds at
most. The page keeps the secret in its tab's ``sessionStorage`` and sends it in the
:data:`HEADER` header with every request.

No cookie is involved: a browser attaches cookies to every port of a host, so a cookie
would hand the console to any page served on another port of ``127.0.0.1``. Storage is
per origin (scheme, host and port), and a header is never added by the browser on its
own: a page elsewhere (another port, another site, a form it posts) holds nothing that
signs it in, and a request without the header is refused. That is also what makes the
session safe against cross-site request forgery, with no token of its own.

Only hashes of codes and secrets are kept; signing out ends a session; a restart of the
service ends them all.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

LINK_TTL = 600.0
SESSION_TTL = 12 * 3600.0
#: the request header that carries a console session's secret
HEADER = "x-lmsp-session"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    client_id: str
    expires: float


class ConsoleSessions:
    def __init__(self) -> None:
        self._links: dict[str, tuple[str, float]] = {}
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def new_link(self, client_id: str, now: float | None = None) -> tuple[str, float]:
        """A one-time login code for ``client_id`` and when it expires (epoch seconds)."""
        now = time.time() if now is None else now
        code = secrets.token_urlsafe(24)
        expires = now + LINK_TTL
        with self._lock:
            self._drop_expired(now)
            self._links[_hash(code)] = (client_id, expires)
        return code, expires

    def redeem(self, code: str, now: float | None = None) -> tuple[str, Session] | None:
        """Spend a login code: a new session id and its session, or ``None`` if the code
        is unknown, used already or expired."""
        now = time.time() if now is None else now
        with self._lock:
            found = self._links.pop(_hash(code), None)
            if found is None or found[1] < now:
                return None
            secret = secrets.token_urlsafe(32)
            session = Session(found[0], now + SESSION_TTL)
            self._sessions[_hash(secret)] = session
            return secret, session

    def session(self, secret: str, now: float | None = None) -> Session | None:
        now = time.time() if now is None else now
        with self._lock:
            found = self._sessions.get(_hash(secret))
            if found is not None and found.expires < now:
                del self._sessions[_hash(secret)]
                return None
            return found

    def end(self, secret: str) -> None:
        with self._lock:
            self._sessions.pop(_hash(secret), None)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, (_, exp) in self._links.items() if exp < now]:
            del self._links[key]
        for key in [k for k, s in self._sessions.items() if s.expires < now]:
            del self._sessions[key]
