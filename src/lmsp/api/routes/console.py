"""The console in the browser: a static page (``/``) and its sign-in.

No front-end build: ``lmsp/api/console/`` holds the HTML, JS and CSS as written. The
page calls the ordinary API with the session cookie (:mod:`lmsp.api.sessions`), so it
can do nothing the owner's token could not, and nothing more.

- ``POST /v1/console/links`` (``admin``): a one-time login link (``lmsp console``).
- ``GET /console/login?code=…``: spends the code, sets the session cookie, goes to ``/``.
- ``GET /console/session``: who is signed in, with the CSRF token the page sends back.
- ``POST /console/logout``.
- ``GET /`` and ``GET /console/pair`` (RFC 8628's ``verification_uri``): the page.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from lmsp import errors
from lmsp.store.clients import Client

from .. import sessions
from ..auth import console_client, require
from .deps import service

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


def _asset(name: str) -> str:
    return resources.files("lmsp.api").joinpath("console", name).read_text(encoding="utf-8")


def login_url(base: str, code: str) -> str:
    return f"{base.rstrip('/')}/console/login?code={code}"


@router.post("/v1/console/links", status_code=201)
async def new_login_link(request: Request, client: Admin) -> dict[str, Any]:
    """A one-time link that signs a browser in to the console as this client (good
    once, for ten minutes): what ``lmsp console`` prints."""
    code, expires = service(request).console.new_link(client.id)
    return {
        "object": "console.link",
        "url": login_url(str(request.base_url), code),
        "expires_at": int(expires),
    }


@router.get("/", include_in_schema=False)
@router.get("/console/pair", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(_asset("index.html"), headers=PAGE_HEADERS)


@router.get("/console/static/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise errors.not_found("file", name)
    return Response(_asset(name), media_type=ASSETS[name], headers=PAGE_HEADERS)


_SPENT = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>lmsp console</title><link rel="stylesheet" href="/console/static/console.css"></head>
<body><main class="signin"><h1>lmsp console</h1>
<p>This login link is not valid: it was used already or it expired.</p>
<p>Run <code>lmsp console</code> on the service's machine for a new one.</p></main></body></html>
"""


@router.get("/console/login", include_in_schema=False)
async def login(request: Request, code: str = "") -> Response:
    svc = service(request)
    redeemed = svc.console.redeem(code) if code else None
    if redeemed is None:
        return HTMLResponse(_SPENT, 403, headers=PAGE_HEADERS)
    secret, _ = redeemed
    answer = RedirectResponse("/", 303, headers=PAGE_HEADERS)
    answer.set_cookie(
        sessions.COOKIE,
        secret,
        max_age=int(sessions.SESSION_TTL),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@router.get("/console/session", include_in_schema=False)
async def whoami(request: Request) -> JSONResponse:
    client = console_client(request)
    secret = request.cookies.get(sessions.COOKIE, "")
    session = service(request).console.session(secret) if secret else None
    if client is None or session is None:
        raise errors.unauthorized()
    return JSONResponse(
        {"client_id": client.id, "name": client.name, "csrf": session.csrf},
        headers={"Cache-Control": "no-store"},
    )


@router.post("/console/logout", include_in_schema=False)
async def logout(request: Request) -> Response:
    if console_client(request) is None:  # checks the CSRF token
        raise errors.unauthorized()
    service(request).console.end(request.cookies.get(sessions.COOKIE, ""))
    answer = JSONResponse({"signed_out": True})
    answer.delete_cookie(sessions.COOKIE, path="/", httponly=True, samesite="strict")
    return answer
