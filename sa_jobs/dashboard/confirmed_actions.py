"""Destructive and bulk actions, each confirmed first: delete one job; cancel a workflow;
retry, cancel or delete the jobs ticked on the jobs list, or every job matching its filter.

A first POST answers with a confirmation page that says what will happen to which jobs
(and which of them the action will leave alone); the page's button POSTs the same form
again with ``confirm=yes``. No script is involved, so it works with JavaScript off.

Everything goes through ``sa_jobs.delete_jobs`` / ``retry_jobs`` / ``cancel_jobs``, so
the API's rules hold here too: running jobs are never deleted, a running job is asked to
stop rather than changed under its worker, an empty filter is refused. Ticked jobs are
acted on in one transaction (they are at most a page or two). An action on a whole
filter works in transactions of :data:`BATCH` jobs, continuing from the last id, for at
most :data:`TIME_BUDGET` seconds per request; past that, the page says how far it got
and offers to continue — no request holds locks on a large part of the table, nor runs
for minutes.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import attrs
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import Response

from sa_jobs._act.by_filter import BulkResult, JobFilter, cancel_jobs, delete_jobs, retry_jobs
from sa_jobs._act.workflow_status import cancel_workflow as cancel_workflow_in
from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table
from sa_jobs._table.workflow_tables import workflow_table
from sa_jobs.dashboard.actions import Form, Refused, action, redirect
from sa_jobs.dashboard.context import Dashboard
from sa_jobs.dashboard.list_filter import ListFilter
from sa_jobs.dashboard.rendering import jobs_count
from sa_jobs.errors import JobNotFoundError

__all__ = [
    "BATCH",
    "MAX_SELECTED",
    "TIME_BUDGET",
    "BulkRequest",
    "bulk",
    "cancel_workflow",
    "delete",
]

Operation = Literal["retry", "cancel", "delete"]

#: Jobs one form may tick (the list shows 50 a page).
MAX_SELECTED = 500
#: The confirmation page counts what a filter matches up to this, then says "more than".
COUNT_CAP = 10_000
#: Jobs per transaction of an action on a whole filter.
BATCH = 1000
#: Seconds of work per request on a whole filter before the page offers to continue.
TIME_BUDGET = 5.0

#: What each operation calls, its button, and the notice after it.
OPERATIONS: dict[str, tuple[Callable[..., BulkResult], str, str]] = {
    "retry": (retry_jobs, "Retry", "bulk-retried"),
    "cancel": (cancel_jobs, "Cancel", "bulk-cancelled"),
    "delete": (delete_jobs, "Delete", "bulk-deleted"),
}

#: Why the action leaves some of the ticked jobs alone (sa_jobs._act.by_filter's own rules).
LEFT_ALONE = {
    "retry": "running jobs cannot be retried and available ones are waiting already",
    "cancel": "completed, cancelled and discarded jobs are finished already",
    "delete": "running jobs are never deleted: cancel them first",
}


@attrs.frozen
class BulkRequest:
    """What a bulk form asks: an operation on ticked ids, or on the list's filter.

    ``list_filter`` is always the list the form came from (where to go back to); with
    ``everything`` it is also what the action applies to.
    """

    operation: Operation
    list_filter: ListFilter
    ids: tuple[int, ...] = ()
    everything: bool = False
    after_id: int = 0

    @classmethod
    def from_form(cls, form: Form) -> BulkRequest:
        """Raises: Refused (400) for an unknown operation, no jobs, too many, a filter
        the Python API cannot apply, or a bad id."""
        operation = form.get("operation")
        if operation not in OPERATIONS:
            raise Refused(400, "The form asks for no known action (retry, cancel or delete).")
        try:
            list_filter = ListFilter.from_params({name: form.get(name) for name in FILTER_FIELDS})
            ids = tuple(dict.fromkeys(_job_id(text) for text in form.all("id")))
            after_id = _job_id(form.get("after_id") or "0", allow_zero=True)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        everything = form.get("scope") == "filter"
        if everything:
            if list_filter.tag or list_filter.text or list_filter.key or list_filter.ref:
                raise Refused(
                    400,
                    "An action on every match takes the state, queue and kind filters "
                    "(those of delete_jobs/retry_jobs/cancel_jobs); tick the jobs instead "
                    "to act on a tag, a partition key, a text search or a referenced row.",
                )
            if not (list_filter.state or list_filter.queue or list_filter.kind):
                raise Refused(400, "Filter the list first: an action on every job is refused.")
        elif not ids:
            raise Refused(400, "No jobs were ticked.")
        elif len(ids) > MAX_SELECTED:
            raise Refused(400, f"At most {MAX_SELECTED} jobs at once; filter instead.")
        return cls(
            cast(Operation, operation), list_filter, () if everything else ids, everything, after_id
        )

    def api_filter(self) -> dict[str, Any]:
        """The keyword filter of ``delete_jobs``/``retry_jobs``/``cancel_jobs``."""
        if not self.everything:
            return {"ids": list(self.ids)}
        found: dict[str, Any] = {}
        if self.list_filter.state is not None:
            found["state"] = self.list_filter.state
        if self.list_filter.queue:
            found["queue"] = self.list_filter.queue
        if self.list_filter.kind:
            found["kind"] = self.list_filter.kind
        return found

    def job_filter(self) -> JobFilter:
        """The API's validated filter (raises InvalidOptionsError as the API would, e.g.
        ``delete`` with ``state=running``)."""
        return JobFilter.build(self.operation, **self.api_filter())

    def fields(self, **changes: str) -> list[tuple[str, str]]:
        """The form again, as hidden fields (for the confirmation or the next round)."""
        found = [("operation", self.operation), *self.list_filter.params().items()]
        found += [("scope", "filter")] if self.everything else [("id", str(i)) for i in self.ids]
        if self.after_id:
            found.append(("after_id", str(self.after_id)))
        return [*found, *changes.items()]


FILTER_FIELDS = ("state", "queue", "kind", "tag", "q", "key", "ref")


def _job_id(text: str, *, allow_zero: bool = False) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a job id") from None
    if not (0 if allow_zero else 1) <= value <= 2**63 - 1:
        raise ValueError(f"{text!r} is not a job id")
    return value


# ---------------------------------------------------------------------- what the page shows


@attrs.frozen
class Ticked:
    id: int
    kind: str
    queue: str
    state: JobState
    #: The action will act on it (else it leaves it as it is).
    acted_on: bool


def ticked_jobs(session: Session, request: BulkRequest) -> list[Ticked]:
    """The ticked jobs still there, and whether the action applies to each."""
    acted_on = set(session.scalars(select(job_table.c.id).where(*_where(request))).all())
    rows = session.execute(
        select(job_table.c.id, job_table.c.kind, job_table.c.queue, job_table.c.state)
        .where(job_table.c.id.in_(request.ids))
        .order_by(job_table.c.id.desc())
    )
    return [Ticked(*row, acted_on=row.id in acted_on) for row in rows]


def matching_count(session: Session, request: BulkRequest, cap: int = COUNT_CAP) -> int:
    """How many jobs the action on a whole filter would touch, counted up to ``cap + 1``."""
    matching = select(job_table.c.id).where(*_where(request)).limit(cap + 1).subquery()
    return session.scalar(select(func.count()).select_from(matching)) or 0


def _where(request: BulkRequest) -> list[Any]:
    return [
        *request.job_filter().where(request.operation),
        *([job_table.c.id > request.after_id] if request.after_id else []),
    ]


# ---------------------------------------------------------------------- the endpoints


async def _bulk(request: Request, dashboard: Dashboard, form: Form) -> Response:
    wanted = BulkRequest.from_form(form)
    wanted.job_filter()  # refused as the API refuses it, before any page is shown
    if not form.confirmed:
        return await _confirmation(request, dashboard, wanted)
    run, _, notice = OPERATIONS[wanted.operation]
    if not wanted.everything:

        def act(session: Session) -> BulkResult:
            return run(session, **wanted.api_filter())

        done = await dashboard.database.write(act)
        return _back_to_list(request, dashboard, wanted, notice, done.count)
    total, after = 0, wanted.after_id
    deadline = time.monotonic() + TIME_BUDGET
    while True:

        def batch(session: Session, after: int = after) -> BulkResult:
            return run(session, **wanted.api_filter(), limit=BATCH, after_id=after)

        done = await dashboard.database.write(batch)
        total += done.count
        if done.last_id is None:
            return _back_to_list(request, dashboard, wanted, notice, total)
        after = done.last_id
        if time.monotonic() > deadline:
            break
    more = attrs.evolve(wanted, after_id=after)
    label = OPERATIONS[wanted.operation][1]
    return dashboard.renderer.page(
        request,
        "confirm.html",
        title=f"{label}: {total:,} done so far",
        lines=[
            f"{total:,} jobs done in this round, up to id {after}. To keep each request "
            f"short, the dashboard stops after {TIME_BUDGET:g} s; more jobs may match.",
        ],
        jobs=[],
        fields=more.fields(confirm="yes"),
        button=f"Continue: {label.lower()} the rest",
        danger=wanted.operation != "retry",
        back=_list_url(dashboard, request, wanted),
        action="/jobs/bulk",
    )


async def _confirmation(request: Request, dashboard: Dashboard, wanted: BulkRequest) -> Response:
    label = OPERATIONS[wanted.operation][1]
    if wanted.everything:
        count = await dashboard.database.read(lambda session: matching_count(session, wanted))
        shown = f"more than {COUNT_CAP:,}" if count > COUNT_CAP else f"{count:,}"
        described = ", ".join(f"{k} = {v}" for k, v in wanted.list_filter.params().items())
        title = f"{label} every job matching {described}?"
        matches = "job matches" if count == 1 else "jobs match"
        lines = [
            f"{shown} {matches} now (only those the action applies to are counted: "
            f"{LEFT_ALONE[wanted.operation]}).",
            f"Done in transactions of {BATCH:,} jobs, in id order.",
        ]
        jobs: Sequence[Ticked] = []
        button = f"{label} {shown} {'job' if count == 1 else 'jobs'}"
    else:
        jobs = await dashboard.database.read(lambda session: ticked_jobs(session, wanted))
        acting = sum(job.acted_on for job in jobs)
        ticked = len(wanted.ids)
        title = f"{label} {acting} of the {ticked} ticked {'job' if ticked == 1 else 'jobs'}?"
        lines = [f"Left as they are: {LEFT_ALONE[wanted.operation]}."]
        if len(jobs) < len(wanted.ids):
            lines.append(f"{len(wanted.ids) - len(jobs)} of them no longer exist.")
        button = f"{label} {jobs_count(acting)}"
    return dashboard.renderer.page(
        request,
        "confirm.html",
        title=title,
        lines=lines,
        jobs=jobs,
        fields=wanted.fields(confirm="yes"),
        button=button,
        danger=wanted.operation != "retry",
        back=_list_url(dashboard, request, wanted),
        action="/jobs/bulk",
    )


async def _delete(request: Request, dashboard: Dashboard, form: Form) -> Response:
    """Delete one job, after a confirmation page; through ``delete_jobs(ids=[id])``."""
    job_id: int = request.path_params["job_id"]

    def state_of(session: Session) -> JobState | None:
        return session.scalar(select(job_table.c.state).where(job_table.c.id == job_id))

    state = await dashboard.database.read(state_of)
    if state is None:
        raise JobNotFoundError(job_id)
    if state is JobState.RUNNING:
        raise Refused(409, f"Job {job_id} is running: {LEFT_ALONE['delete']}.")
    if not form.confirmed:
        return dashboard.renderer.page(
            request,
            "confirm.html",
            title=f"Delete job {job_id}?",
            lines=[
                f"The job ({state.value}) and its history — args, errors, attempts — are "
                "removed for good. Retention deletes finished jobs by itself; delete by hand "
                "what must not run or stay."
            ],
            jobs=[],
            fields=[("confirm", "yes")],
            button=f"Delete job {job_id}",
            danger=True,
            back=dashboard.renderer.prefix(request) + f"/jobs/{job_id}",
            action=f"/jobs/{job_id}/delete",
        )

    def work(session: Session) -> BulkResult:
        return delete_jobs(session, ids=[job_id])

    if (await dashboard.database.write(work)).count == 0:
        # It started running (or went) between the confirmation and now.
        raise Refused(409, f"Job {job_id} was not deleted: {LEFT_ALONE['delete']}.")
    return redirect(request, dashboard, "/jobs", "deleted")


def _list_url(dashboard: Dashboard, request: Request, wanted: BulkRequest) -> str:
    query = urllib.parse.urlencode(wanted.list_filter.params())
    return dashboard.renderer.prefix(request) + "/jobs" + (f"?{query}" if query else "")


def _back_to_list(
    request: Request, dashboard: Dashboard, wanted: BulkRequest, notice: str, count: int
) -> Response:
    return redirect(request, dashboard, "/jobs", notice, **wanted.list_filter.params(), n=count)


async def _cancel_workflow(request: Request, dashboard: Dashboard, form: Form) -> Response:
    """Cancel a workflow's unfinished steps and its callbacks, after a confirmation page;
    through ``sa_jobs.cancel_workflow`` (running steps are asked to stop)."""
    workflow_id: int = request.path_params["workflow_id"]

    def row_of(session: Session) -> Any:
        return session.execute(
            select(
                workflow_table.c.name, workflow_table.c.unfinished, workflow_table.c.total
            ).where(workflow_table.c.id == workflow_id)
        ).first()

    row = await dashboard.database.read(row_of)
    if row is None:
        raise Refused(404, f"There is no workflow {workflow_id}.")
    back = dashboard.renderer.prefix(request) + f"/workflows/{workflow_id}"
    if not form.confirmed:
        return dashboard.renderer.page(
            request,
            "confirm.html",
            title=f"Cancel workflow {workflow_id} ({row.name})?",
            lines=[
                f"Its {row.unfinished:,} unfinished of {row.total:,} steps are cancelled "
                "(running ones are asked to stop), and its callbacks that have not run "
                "will not. Finished steps stay as they are; retrying a step later "
                "resumes the workflow, without its callbacks."
            ],
            jobs=[],
            fields=[("confirm", "yes")],
            button=f"Cancel workflow {workflow_id}",
            danger=True,
            back=back,
            action=f"/workflows/{workflow_id}/cancel",
        )

    def work(session: Session) -> int:
        return cancel_workflow_in(session, workflow_id)

    count = await dashboard.database.write(work)
    return redirect(request, dashboard, f"/workflows/{workflow_id}", "workflow-cancelled", n=count)


bulk = action(_bulk)
delete = action(_delete)
cancel_workflow = action(_cancel_workflow)
