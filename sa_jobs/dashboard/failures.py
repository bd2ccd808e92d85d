"""Errors that escape a page or an action, as pages: with the dashboard's look, its
security headers, and a message that says what happened.

Actions turn the errors they expect into pages themselves (:func:`.actions.action`);
this is for the rest — above all the database: a statement past the dashboard's
``statement_timeout`` or a database that cannot be reached is a **503** (try again
later), a schema branch that is missing is a **500** with sa_jobs' message naming the
branch and the command that installs it. Without it Starlette would answer a bare
``Internal Server Error`` without the Content-Security-Policy every page carries.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sa_jobs.dashboard import database
from sa_jobs.dashboard.context import Dashboard
from sa_jobs.errors import SaJobsError

__all__ = ["HANDLED", "http_error", "page_for_error"]

log = logging.getLogger("sa_jobs.dashboard")

#: The exceptions :func:`page_for_error` answers (anything else is still a 500 page).
HANDLED: tuple[type[Exception], ...] = (OperationalError, DBAPIError, SaJobsError, Exception)


async def page_for_error(request: Request, exc: Exception) -> Response:
    dashboard = Dashboard.of(request)
    status, message = _explain(exc)
    if status >= 500:
        log.warning("dashboard %s %s failed: %s", request.method, request.url.path, exc)
    return dashboard.error_page(request, status, message)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404 for an unknown path, 405 for a GET on an action)."""
    assert isinstance(exc, HTTPException)
    dashboard = Dashboard.of(request)
    response = dashboard.error_page(request, exc.status_code, exc.detail)
    response.headers.update(exc.headers or {})
    return response


def _explain(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, OperationalError):
        if type(exc.orig).__name__ == "QueryCanceled":
            return 503, (
                "A query of this page ran longer than the dashboard allows "
                f"({database.STATEMENT_TIMEOUT_MS / 1000:g} s) and was cancelled. The "
                "database may be busy or a lock held: try again in a moment."
            )
        return 503, (
            "The database could not be reached or failed while answering "
            f"({type(exc.orig).__name__}). Try again in a moment."
        )
    if isinstance(exc, SaJobsError):
        return 500, str(exc)
    if isinstance(exc, DBAPIError):
        return 500, f"The database refused this page's query ({type(exc.orig).__name__})."
    return 500, "The dashboard failed on this request; the server's log has the details."
