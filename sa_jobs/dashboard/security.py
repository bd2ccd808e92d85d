"""Who may see the dashboard, and proof that an action came from the dashboard's own form.

**Auth.** ``create_app(auth=...)`` takes a callable on the Starlette ``Request``: it
returns True to let the request in, False to refuse it (403), or a ``Response`` to send
instead (a login redirect, a 401 challenge); it may be async. :func:`basic_auth` is one
such callable, for HTTP basic credentials (what ``sa-jobs dashboard`` uses). Every
request goes through it, the stylesheet included.

**CSRF.** Every action is a POST carrying a token that must equal the ``sa_jobs_csrf``
cookie (the "double submit" pattern): another site can make a browser send the cookie,
but cannot read it to put it in the form. The cookie is ``SameSite=Strict`` and
``HttpOnly``, and a POST whose ``Origin`` (or ``Sec-Fetch-Site``) says it comes from
another site is refused outright. Nothing is stored on the server, so any number of
processes can serve the dashboard without sharing a secret.

**Headers.** Pages are sent with a Content-Security-Policy that allows no script at
all (the dashboard has none), no framing, and forms posting only to itself: even an
escaping bug in a template could not run a job's ``<script>``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "SECURITY_HEADERS",
    "Auth",
    "AuthGate",
    "basic_auth",
    "csrf_problem",
    "csrf_token",
]

#: What ``create_app(auth=...)`` accepts.
Auth = Callable[[Request], "bool | Response | Awaitable[bool | Response]"]

CSRF_COOKIE = "sa_jobs_csrf"
CSRF_FIELD = "csrf"

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class AuthGate:
    """ASGI middleware: every HTTP request passes ``auth`` first."""

    def __init__(self, app: ASGIApp, auth: Auth | None) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.auth is None:
            await self.app(scope, receive, send)
            return
        verdict = self.auth(Request(scope, receive))
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is True:
            await self.app(scope, receive, send)
            return
        if not isinstance(verdict, Response):
            verdict = PlainTextResponse("Forbidden: the dashboard's auth refused you.", 403)
        await verdict(scope, receive, send)


def basic_auth(username: str, password: str, *, realm: str = "sa_jobs") -> Auth:
    """An ``auth`` callable admitting one user by HTTP basic credentials.

    Compared in constant time. Basic credentials travel in clear text: put the dashboard
    behind TLS (a reverse proxy) when it is reachable from another machine.

    Raises:
        InvalidOptionsError: an empty username or password.
    """
    if not username or not password:
        raise InvalidOptionsError(
            "basic_auth", "needs a non-empty username and password (an empty one lets anyone in)"
        )
    expected = f"{username}:{password}".encode()
    challenge = {"www-authenticate": f'Basic realm="{realm}", charset="UTF-8"'}

    def check(request: Request) -> bool | Response:
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                given = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                given = b""
            if hmac.compare_digest(given, expected):
                return True
        return PlainTextResponse("Sign in to see the sa_jobs dashboard.", 401, headers=challenge)

    return check


def csrf_token(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then the response must set it)."""
    existing = request.cookies.get(CSRF_COOKIE, "")
    if len(existing) >= 32:
        return existing, False
    return secrets.token_urlsafe(32), True


def set_csrf_cookie(response: Response, token: str, path: str) -> None:
    response.set_cookie(
        CSRF_COOKIE, token, path=path or "/", httponly=True, samesite="strict", secure=False
    )


def csrf_problem(request: Request, submitted: str) -> str | None:
    """Why this POST must be refused, or None if it is the dashboard's own form."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is not None:
        # A proxy may rewrite Host; the host it was asked for is then X-Forwarded-Host
        # (a header no cross-site form can set).
        hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}
        if urlsplit(origin).netloc not in hosts - {None}:
            return "the request came from another origin"
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not submitted:
        return "the form's CSRF token is missing (reload the page and try again)"
    if not hmac.compare_digest(cookie.encode(), submitted.encode()):
        return "the form's CSRF token does not match (reload the page and try again)"
    return None
