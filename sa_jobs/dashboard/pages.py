"""The dashboard's pages (GET): overview, jobs, one job, sequences, periodic jobs, workers,
workflows and one workflow.

Each handler reads what its page shows in one short transaction
(:class:`~sa_jobs.dashboard.database.Database`) and renders it; none of them writes.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sa_jobs._inspect.queue_stats import Stats, stats
from sa_jobs._table.schema import WORKFLOW_BRANCH, Features
from sa_jobs.dashboard import job_list, queries, workflow_view
from sa_jobs.dashboard.charts import hour_chart
from sa_jobs.dashboard.context import Dashboard
from sa_jobs.dashboard.list_choices import (
    ListChoices,
    applicable_operations,
    list_choices,
    not_offered,
)
from sa_jobs.dashboard.list_filter import FilterError, ListFilter
from sa_jobs.dashboard.periodic_view import STALE_AFTER, periodic_view
from sa_jobs.dashboard.queue_view import QueuesView, queues_view
from sa_jobs.dashboard.sequence_keys import MAX_FIELDS
from sa_jobs.dashboard.workers_view import workers_view
from sa_jobs.errors import SchemaMissingError

__all__ = [
    "job",
    "jobs",
    "overview",
    "periodic",
    "sequences",
    "workers",
    "workflow",
    "workflows",
]


async def overview(request: Request) -> Response:
    dashboard = Dashboard.of(request)

    def read(session: Any) -> tuple[Stats, QueuesView, queries.Throughput]:
        # sa_jobs.stats: the same figures as `sa-jobs stats` (estimates past its limit).
        figures = stats(session)
        hour = queries.throughput(session)
        return figures, queues_view(session, figures, hour), hour

    figures, queues, hour = await dashboard.database.read(read)
    return dashboard.renderer.page(
        request,
        "overview.html",
        stats=figures,
        queues=queues,
        chart=hour_chart(hour.minutes),
        capped=hour.capped,
    )


async def jobs(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    params = request.query_params
    try:
        jobs_filter = ListFilter.from_params(params)
        before = _optional_id(params.get("before", ""))
    except ValueError as exc:
        return dashboard.error_page(request, 400, str(exc))
    after = params.get("after", "").strip()
    operations = applicable_operations(jobs_filter.state)

    def read(session: Any) -> tuple[job_list.JobPage, ListChoices]:
        found = job_list.list_jobs(session, jobs_filter, before, after=after)
        return found, list_choices(session, jobs_filter.queue)

    try:
        page, choices = await dashboard.database.read(read)
    except FilterError as exc:
        return dashboard.error_page(request, 400, str(exc))
    return dashboard.renderer.page(
        request,
        "jobs.html",
        filter=jobs_filter,
        result=page,
        choices=choices,
        operations=operations,
        not_offered=not_offered(operations),
        paged=bool(before or after),
        next_params={**jobs_filter.params(), **page.next} if page.next else None,
        window=job_list.SCAN_WINDOW,
    )


async def job(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    job_id: int = request.path_params["job_id"]

    def read(
        session: Any,
    ) -> tuple[queries.JobDetail | None, workflow_view.StepPlace | None]:
        detail = queries.job_detail(session, job_id)
        place = workflow_view.step_place(session, job_id) if detail is not None else None
        return detail, place

    detail, place = await dashboard.database.read(read)
    if detail is None:
        return dashboard.error_page(request, 404, f"There is no job {job_id}.")
    return dashboard.renderer.page(request, "job.html", detail=detail, job=detail.job, place=place)


async def sequences(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    halted = await dashboard.database.read(queries.halted_sequences)
    return dashboard.renderer.page(
        request, "sequences.html", halted=halted, cap=queries.LIST_CAP, max_fields=MAX_FIELDS
    )


async def periodic(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    view = await dashboard.database.read(periodic_view)
    return dashboard.renderer.page(request, "periodic.html", view=view, stale_after=STALE_AFTER)


async def workers(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    view = await dashboard.database.read(workers_view)
    return dashboard.renderer.page(request, "workers.html", view=view)


#: Job ids are bigint.
MAX_ID = 2**63 - 1


def _optional_id(text: str) -> int | None:
    if not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a job id") from None
    if not 1 <= value <= MAX_ID:
        raise ValueError(f"{text!r} is not a job id")
    return value


# ---------------------------------------------------------------------- workflows


async def workflows(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    try:
        before = _optional_id(request.query_params.get("before", ""))
    except ValueError as exc:
        return dashboard.error_page(request, 400, str(exc))

    def read(session: Any) -> workflow_view.WorkflowPage | None:
        if not Features.of(session.connection()).workflow:
            return None
        return workflow_view.list_workflows(session, before)

    found = await dashboard.database.read(read)
    return dashboard.renderer.page(
        request, "workflows.html", result=found, paged=before is not None
    )


async def workflow(request: Request) -> Response:
    dashboard = Dashboard.of(request)
    workflow_id: int = request.path_params["workflow_id"]
    after = request.query_params.get("after", "")

    def read(session: Any) -> workflow_view.WorkflowDetail | None:
        if not Features.of(session.connection()).workflow:
            raise SchemaMissingError(WORKFLOW_BRANCH, "workflows are stored there")
        return workflow_view.workflow_detail(session, workflow_id, after)

    detail = await dashboard.database.read(read)
    if detail is None:
        return dashboard.error_page(request, 404, f"There is no workflow {workflow_id}.")
    return dashboard.renderer.page(
        request,
        "workflow.html",
        detail=detail,
        wf=detail.summary,
        count_limit=workflow_view.COUNT_LIMIT,
        graph_limit=workflow_view.GRAPH_LIMIT,
        edges_shown=workflow_view.EDGES_SHOWN,
        paged=bool(after),
    )
