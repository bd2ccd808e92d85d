"""Who may see the dashboard, and proof that an action came from the dashboard's own form.

**Auth.** ``create_app(auth=...)`` takes a callable on the Starlette ``Request``: it
returns a ``Response`` to send instead (a login redirect, a 401 challenge), or a verdict
taken as a truth value — truthy lets the request in, falsy (``False``, ``None``) is
refused with 403; it may be async. :func:`basic_auth` is one such callable, for HTTP
basic credentials (what ``sa-jobs dashboard`` uses). Every request goes through it, the
stylesheet included.

**CSRF.** Every action is a POST carrying a token that must equal the CSRF cookie (the
"double submit" pattern): another site can make a browser send the cookie, but cannot
read it to put it in the form. The cookie is ``SameSite=Strict`` and ``HttpOnly``; over
https it is also ``Secure`` and named ``__Host-sa_jobs_csrf`` (so no sibling subdomain
can plant one), and a cookie that is not a token :func:`csrf_token` could have made is
ignored. A POST whose ``Origin`` (or ``Sec-Fetch-Site``) says it comes from another site
is refused outright. Nothing is stored on the server, so any number of processes can
serve the dashboard without sharing a secret.

**Headers.** Pages are sent with a Content-Security-Policy that allows no script at
all (the dashboard has none), no framing, and forms posting only to itself: even an
escaping bug in a template could not run a job's ``<script>``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import re
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
    "SECURE_CSRF_COOKIE",
    "SECURITY_HEADERS",
    "Auth",
    "AuthGate",
    "basic_auth",
    "csrf_cookie_name",
    "csrf_problem",
    "csrf_token",
    "set_csrf_cookie",
]

Auth = Callable[[Request], "Response | object | Awaitable[Response | object]"]
"""What ``create_app(auth=...)`` accepts: a function of the request returning (or a
coroutine function resolving to) a ``Response``, or a verdict read as a truth value."""

CSRF_COOKIE = "sa_jobs_csrf"
#: Over https: a ``__Host-`` cookie must be ``Secure``, for path ``/``, and without a
#: domain, so a sibling subdomain cannot set one for the dashboard's host.
SECURE_CSRF_COOKIE = "__Host-" + CSRF_COOKIE
CSRF_FIELD = "csrf"
#: What :func:`csrf_token` makes: ``secrets.token_urlsafe(32)``, 43 characters.
TOKEN_BYTES = 32
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")

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
        if isinstance(verdict, Response):
            await verdict(scope, receive, send)
        elif verdict:
            await self.app(scope, receive, send)
        else:
            refused = PlainTextResponse("Forbidden: the dashboard's auth refused you.", 403)
            await refused(scope, receive, send)


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


def csrf_cookie_name(request: Request) -> str:
    """The CSRF cookie's name for this request: ``__Host-`` prefixed over https."""
    return SECURE_CSRF_COOKIE if request.url.scheme == "https" else CSRF_COOKIE


def _cookie_token(request: Request) -> str | None:
    """The CSRF cookie's token, if it has the shape :func:`csrf_token` gives one."""
    found = request.cookies.get(csrf_cookie_name(request), "")
    return found if _TOKEN_SHAPE.fullmatch(found) else None


def csrf_token(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then the response must set it)."""
    existing = _cookie_token(request)
    if existing is not None:
        return existing, False
    return secrets.token_urlsafe(TOKEN_BYTES), True


def set_csrf_cookie(response: Response, request: Request, token: str, path: str) -> None:
    """Set the CSRF cookie: for the dashboard's ``path`` over http; over https ``Secure``
    and ``__Host-`` prefixed, which requires path ``/``."""
    secure = request.url.scheme == "https"
    response.set_cookie(
        csrf_cookie_name(request),
        token,
        path="/" if secure else (path or "/"),
        httponly=True,
        samesite="strict",
        secure=secure,
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
    cookie = _cookie_token(request)
    if cookie is None or not submitted:
        return "the form's CSRF token is missing (reload the page and try again)"
    if not hmac.compare_digest(cookie.encode(), submitted.encode()):
        return "the form's CSRF token does not match (reload the page and try again)"
    return None
