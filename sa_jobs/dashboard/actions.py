"""The dashboard's actions (POST): each one checks the form, then calls the session
function the Python API offers for it, in a transaction of its own.

No action runs on a GET, and none runs without the CSRF token of the dashboard's own
form (:mod:`sa_jobs.dashboard.security`). With ``read_only=True`` every action answers
403 before reading its form. Destructive actions (delete, and every bulk action) first
answer with a page that says what they will do and asks to confirm; the confirmation is
another POST of the same form with ``confirm=yes``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sa_jobs._act.control import cancel_job, retry_job
from sa_jobs._act.queues import pause_queue, resume_queue
from sa_jobs._base.states import JobState
from sa_jobs._table.schema import SEQUENCE_BRANCH, Features
from sa_jobs.dashboard.context import Dashboard
from sa_jobs.dashboard.queries import halts_sequence
from sa_jobs.dashboard.security import CSRF_FIELD, csrf_problem
from sa_jobs.errors import (
    InvalidJobArgsError,
    InvalidOptionsError,
    JobNotFoundError,
    PeriodicJobNotFoundError,
    SaJobsError,
    SchemaMissingError,
    UnknownKindError,
    UnknownQueueError,
    WorkflowNotFoundError,
)
from sa_jobs.periodic import run_now

__all__ = [
    "Form",
    "Refused",
    "action",
    "cancel",
    "pause",
    "redirect",
    "resume_sequence",
    "retry",
    "run_periodic_now",
    "unpause",
]

#: A form is a few ids and names; anything bigger is not the dashboard's.
MAX_FORM_BYTES = 256 * 1024
FORM_TYPE = "application/x-www-form-urlencoded"


@attrs.frozen
class Form:
    """A POSTed form: every value of each field, in order."""

    fields: dict[str, list[str]]

    def get(self, name: str) -> str:
        values = self.fields.get(name)
        return values[0] if values else ""

    def all(self, name: str) -> list[str]:
        return self.fields.get(name, [])

    @property
    def confirmed(self) -> bool:
        return self.get("confirm") == "yes"


class Refused(Exception):
    """The request cannot be an action: its status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_form(request: Request, dashboard: Dashboard) -> Form:
    """The action's form, once the request has shown it may act.

    Raises:
        Refused: read-only dashboard (403), not a form (415), too big (413), or no valid
            CSRF token (403).
    """
    if dashboard.read_only:
        raise Refused(403, "This dashboard is read-only: it takes no actions.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, "The form is too large.")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and content_type != FORM_TYPE:
        raise Refused(415, f"An action is a form post ({FORM_TYPE}).")
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    form = Form(fields)
    problem = csrf_problem(request, form.get(CSRF_FIELD))
    if problem is not None:
        raise Refused(403, f"Refused: {problem}.")
    return form


def action(
    run: Callable[[Request, Dashboard, Form], Any],
) -> Callable[[Request], Any]:
    """An endpoint: read and check the form, run the action, turn sa_jobs' errors into
    pages with sa_jobs' own message: 404 for a job, periodic job or workflow that is gone, 400 for
    bad input (an unknown queue or kind, a filter the action refuses), 409 for an action
    the job's state refuses or a feature branch that is not installed."""

    async def endpoint(request: Request) -> Response:
        dashboard = Dashboard.of(request)
        try:
            form = await read_form(request, dashboard)
            response: Response = await run(request, dashboard, form)
            return response
        except Refused as refused:
            return dashboard.error_page(request, refused.status, refused.message)
        except (JobNotFoundError, PeriodicJobNotFoundError, WorkflowNotFoundError) as exc:
            return dashboard.error_page(request, 404, str(exc))
        except (
            InvalidOptionsError,
            InvalidJobArgsError,
            UnknownKindError,
            UnknownQueueError,
        ) as exc:
            return dashboard.error_page(request, 400, str(exc))
        except SaJobsError as exc:
            return dashboard.error_page(request, 409, str(exc))

    endpoint.__name__ = run.__name__
    return endpoint


def redirect(
    request: Request, dashboard: Dashboard, path: str, notice: str, **params: str | int
) -> Response:
    """See Other, to the page that shows the action's result (POST, redirect, GET)."""
    query = urllib.parse.urlencode({**params, "notice": notice})
    target = dashboard.renderer.prefix(request) + path + "?" + query
    return RedirectResponse(target, status_code=303)


# ---------------------------------------------------------------------- one job


async def _retry(request: Request, dashboard: Dashboard, form: Form) -> Response:
    job_id: int = request.path_params["job_id"]

    def work(session: Session) -> None:
        retry_job(session, job_id)

    await dashboard.database.write(work)
    return redirect(request, dashboard, f"/jobs/{job_id}", "retried")


async def _cancel(request: Request, dashboard: Dashboard, form: Form) -> Response:
    job_id: int = request.path_params["job_id"]

    def work(session: Session) -> JobState:
        return cancel_job(session, job_id).state

    state = await dashboard.database.write(work)
    # cancel_job returns a finished job unchanged, and a running one still running
    # (its worker is asked to stop): say which happened.
    notice = {JobState.CANCELLED: "cancelled", JobState.RUNNING: "cancel-requested"}.get(
        state, "already-finished"
    )
    return redirect(request, dashboard, f"/jobs/{job_id}", notice)


async def _resume_sequence(request: Request, dashboard: Dashboard, form: Form) -> Response:
    """A halted sequence resumes when its halted job is retried (docs/sequences.md).

    Only a job that halts a sequence is retried here (409 otherwise): the button is on
    the Sequences page, and a stale page must not retry some other job."""
    job_id: int = request.path_params["job_id"]

    def work(session: Session) -> None:
        if not Features.of(session.connection()).sequence:
            raise SchemaMissingError(SEQUENCE_BRANCH, "resuming a halted sequence")
        if not halts_sequence(session, job_id):
            raise Refused(
                409,
                f"Job {job_id} does not halt a sequence (any more): nothing to resume. "
                "See the Sequences page for the halted ones.",
            )
        retry_job(session, job_id)

    await dashboard.database.write(work)
    return redirect(request, dashboard, "/sequences", "resumed")


# ---------------------------------------------------------------------- periodic jobs


async def _run_periodic_now(request: Request, dashboard: Dashboard, form: Form) -> Response:
    """Request one extra run: stored in the row, fired by the next tick of a worker that
    has the job in its code (docs/periodic-jobs.md). The name travels in the form, not
    the path: periodic job names are free text."""
    name = form.get("name")
    if not name:
        raise Refused(400, "Which periodic job? The form names none.")

    def work(session: Session) -> None:
        run_now(session, name)

    await dashboard.database.write(work)
    return redirect(request, dashboard, "/periodic", "ran")


# ---------------------------------------------------------------------- queues


def _queue(form: Form) -> str:
    # The name travels in the form, not the path: queue names are free text.
    name = form.get("queue")
    if not name:
        raise Refused(400, "Which queue? The form names none.")
    return name


async def _pause(request: Request, dashboard: Dashboard, form: Form) -> Response:
    """Pause a queue for every worker (``sa_jobs.pause_queue``; a queue nothing names is
    refused there, so a mistyped name pauses nothing)."""
    queue = _queue(form)

    def work(session: Session) -> None:
        pause_queue(session, queue)

    await dashboard.database.write(work)
    return redirect(request, dashboard, "/", "paused")


async def _unpause(request: Request, dashboard: Dashboard, form: Form) -> Response:
    queue = _queue(form)

    def work(session: Session) -> None:
        resume_queue(session, queue)

    await dashboard.database.write(work)
    return redirect(request, dashboard, "/", "unpaused")


retry = action(_retry)
cancel = action(_cancel)
resume_sequence = action(_resume_sequence)
run_periodic_now = action(_run_periodic_now)
pause = action(_pause)
unpause = action(_unpause)
