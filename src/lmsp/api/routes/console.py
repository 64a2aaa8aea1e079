"""The console in the browser: a static page (``/``) and its sign-in.

No front-end build: ``lmsp/api/console/`` holds the HTML, JS and CSS as written. The
page calls the ordinary API with its session's secret in a header
(:mod:`lmsp.api.sessions`), so it can do nothing the owner's token could not, and
nothing more.

- ``POST /v1/console/links`` (``admin``): a one-time login link (``lmsp console``),
  ``/console/login#code=…``: the code is in the fragment, which the browser keeps.
- ``GET /console/login``: the page, which spends the code from its fragment with
- ``POST /console/session`` ``{"code"}`` → ``201`` with the session's secret (once);
- ``GET /console/session``: who is signed in; ``DELETE /console/session``: sign out.
- ``GET /`` and ``GET /console/pair`` (RFC 8628's ``verification_uri``): the page.

Login links and pairing links name one origin, :func:`console_origin`, whatever
``Host`` the caller used: a browser keeps a session per origin, and a link to
``localhost`` would find none signed in at ``127.0.0.1``.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StringConstraints

from lmsp import errors
from lmsp.api import sessions
from lmsp.api.auth import console_client, require
from lmsp.api.routes.deps import service
from lmsp.api.state import http
from lmsp.app import clients
from lmsp.config import Settings
from lmsp.store.clients import Client

router = APIRouter(tags=["console"])

Admin = Annotated[Client, Depends(require("admin"))]

#: what the page may load and talk to: itself only
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
NO_STORE = {"Cache-Control": "no-store"}
WILDCARDS = ("0.0.0.0", "::", "")


def _asset(name: str) -> str:
    return resources.files("lmsp.api").joinpath("console", name).read_text(encoding="utf-8")


def console_origin(settings: Settings, request: Request | None = None) -> str:
    """The one origin of the console's links: the address the service is bound to
    (``127.0.0.1`` by default). Bound to a wildcard address, or behind a trusted proxy,
    that address says nothing a browser can use: then the origin the request came to
    (its ``Host`` passed :class:`lmsp.api.hosts.RequestGate`), or ``127.0.0.1`` for the
    serve banner."""
    host = settings.host
    if request is not None and (host in WILDCARDS or settings.trusted_proxies):
        return str(request.base_url).rstrip("/")
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def login_url(origin: str, code: str) -> str:
    return f"{origin}/console/login#code={code}"


@router.post("/v1/console/links", status_code=201)
async def new_login_link(request: Request, client: Admin) -> dict[str, Any]:
    """A one-time link that signs a browser tab in to the console as this client (good
    once, for ten minutes): what ``lmsp console`` prints."""
    code, expires = http(request).console.new_link(client.id)
    return {
        "object": "console.link",
        "url": login_url(console_origin(service(request).settings, request), code),
        "expires_at": int(expires),
    }


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
@router.get("/console/pair", include_in_schema=False)
@router.get("/console/login", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(_asset("index.html"), headers=PAGE_HEADERS)


@router.get("/console/static/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise errors.not_found("file", name)
    return Response(_asset(name), media_type=ASSETS[name], headers=PAGE_HEADERS)


class LoginCode(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    code: Annotated[str, StringConstraints(min_length=1, max_length=128)]


SPENT = "This login link is not valid: it was used already or it expired."


def _session(client: Client, expires: float) -> dict[str, Any]:
    return {
        "object": "console.session",
        "client_id": client.id,
        "name": client.name,
        "expires_at": int(expires),
    }


@router.post("/console/session", include_in_schema=False, status_code=201)
async def sign_in(body: LoginCode, request: Request) -> JSONResponse:
    """Spend a login link's code: the session's secret, in this answer only."""
    sessions_kept = http(request).console
    redeemed = sessions_kept.redeem(body.code)
    if redeemed is None:
        raise errors.unauthorized(SPENT)
    secret, session = redeemed
    client = await clients.signed_in(service(request), session.client_id)
    if client is None:  # revoked since the link was made
        sessions_kept.end(secret)
        raise errors.unauthorized(SPENT)
    shown = dict(_session(client, session.expires), secret=secret)
    return JSONResponse(shown, 201, headers=NO_STORE)


@router.get("/console/session", include_in_schema=False)
async def whoami(request: Request) -> JSONResponse:
    session = http(request).console.session(request.headers.get(sessions.HEADER, ""))
    client = console_client(request)
    if client is None or session is None:
        raise errors.unauthorized("Not signed in to the console.")
    return JSONResponse(_session(client, session.expires), headers=NO_STORE)


@router.delete("/console/session", include_in_schema=False)
async def sign_out(request: Request) -> JSONResponse:
    secret = request.headers.get(sessions.HEADER, "")
    if console_client(request) is None:
        raise errors.unauthorized("Not signed in to the console.")
    http(request).console.end(secret)
    return JSONResponse({"object": "console.session", "signed_out": True}, headers=NO_STORE)
