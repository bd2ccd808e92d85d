"""Writing workflows: :func:`insert_workflow`, in the caller's transaction.

Everything is validated in Python first (args, options, names, edges), then the ids are
drawn — the workflow's and one job id per step and callback, in one statement — and
a second statement writes the workflow row, the edges and the jobs together (two
data-modifying CTEs and the job ``INSERT``): two round trips for any size. Knowing the
ids up front is what lets the edges and the workflow row name the jobs, and it gives
each step a larger id than the steps it waits for (they come earlier in the input).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    Integer,
    SmallInteger,
    Text,
    bindparam,
    case,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy import DateTime as SADateTime
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from sa_jobs._base.records import JobRow
from sa_jobs._base.sessions import either_session
from sa_jobs._base.sql import json_recordset
from sa_jobs._base.states import InsertAction, JobState
from sa_jobs._declare.workflow import Workflow
from sa_jobs._insert.rows import build_rows
from sa_jobs._table.models import Job, job_state_type
from sa_jobs._table.schema import WORKFLOW_BRANCH, Features, translate_missing_schema
from sa_jobs._table.workflow_tables import CALLBACK_KEY, dep_table, workflow_table
from sa_jobs.errors import InvalidWorkflowError, SchemaMissingError
from sa_jobs.hooks import INSERT_HOOKS, InsertCall

__all__ = [
    "InsertedWorkflow",
    "around_insert",
    "insert_workflow",
    "require_workflows",
    "step_rows",
]

W = TypeVar("W")


@attrs.frozen
class InsertedWorkflow:
    """What :func:`insert_workflow` wrote: the workflow's id, each step's job id by step
    name (in the order they were added), and each callback's job id by role."""

    id: int
    jobs: Mapping[str, int]
    callbacks: Mapping[str, int]

    def __getitem__(self, step: str) -> int:
        """The job id of step ``step``."""
        return self.jobs[step]


def require_workflows(connection: Connection) -> None:
    """Raise the usual error naming the branch when workflows are not installed."""
    if not Features.of(connection).workflow:
        raise SchemaMissingError(WORKFLOW_BRANCH, "there is no sa_job_workflow table")


_ROWS = "sa_jobs_wf_rows"
_WORKFLOW = "sa_jobs_wf_row"
_EDGE_FROM = "sa_jobs_wf_edge_from"
_EDGE_TO = "sa_jobs_wf_edge_to"
_EDGE_RUN = "sa_jobs_wf_edge_run"
_COUNT = "sa_jobs_wf_id_count"
_WF_ID = "sa_jobs_wf_id"
_EDGE_RESOLVED = "sa_jobs_wf_edge_resolved"

_ROW_COLUMNS = (
    column("id", BigInteger),
    column("kind", Text),
    column("args", JSONB),
    column("queue", Text),
    column("priority", SmallInteger),
    column("max_attempts", SmallInteger),
    column("tags", ARRAY(Text)),
    column("metadata", JSONB),
    column("scheduled_at", SADateTime(timezone=True)),
    column("pending", Boolean),
    column("workflow_id", BigInteger),
    column("workflow_step", Text),
    column("workflow_deps", Integer),
)
_WORKFLOW_COLUMNS = (
    column("id", BigInteger),
    column("name", Text),
    column("on_dependency_failure", Text),
    column("total", Integer),
    column("on_success_job_id", BigInteger),
    column("on_complete_job_id", BigInteger),
    column("on_failure_job_id", BigInteger),
)


@functools.cache
def _draw_ids() -> Any:
    """The workflow's id and ``n`` job ids, from the tables' own identity sequences."""
    job_ids = select(func.nextval(literal_column("'sa_job_id_seq'"))).select_from(
        func.generate_series(1, bindparam(_COUNT, type_=Integer))
    )
    return select(
        func.nextval(literal_column("'sa_job_workflow_id_seq'")),
        func.array(job_ids.scalar_subquery()),
    )


@functools.cache
def _insert_statement(*, with_workflow_row: bool = True) -> Any:
    """Insert the jobs (and, with ``with_workflow_row``, the workflow row), and the edges."""
    rows = json_recordset(_ROWS, _ROW_COLUMNS, "step_rows")
    due_at = func.coalesce(rows.c.scheduled_at, func.now())
    state = case(
        (rows.c.pending, JobState.PENDING.value),
        (due_at > func.now(), JobState.SCHEDULED.value),
        else_=JobState.AVAILABLE.value,
    )
    values = [
        rows.c.id,
        rows.c.kind,
        rows.c.args,
        sql_cast(state, job_state_type),
        rows.c.queue,
        rows.c.priority,
        rows.c.max_attempts,
        rows.c.tags,
        rows.c.metadata,
        due_at,
        rows.c.workflow_id,
        rows.c.workflow_step,
        rows.c.workflow_deps,
    ]
    names = ["id", "kind", "args", "state", "queue", "priority", "max_attempts", "tags"]
    names += ["metadata", "scheduled_at", "workflow_id", "workflow_step", "workflow_deps"]
    statement = pg_insert(Job).from_select(names, select(*values).order_by(rows.c.id))
    edges = (
        func.unnest(
            bindparam(_EDGE_FROM, type_=ARRAY(BigInteger)),
            bindparam(_EDGE_TO, type_=ARRAY(BigInteger)),
            bindparam(_EDGE_RUN, type_=ARRAY(Boolean)),
            bindparam(_EDGE_RESOLVED, type_=ARRAY(Boolean)),
        )
        .table_valued("depends_on_id", "job_id", "run_on_failure", "resolved")
        .render_derived(name="edges")
    )
    edge_rows = select(
        edges.c.depends_on_id,
        edges.c.job_id,
        bindparam(_WF_ID, type_=BigInteger),
        edges.c.run_on_failure,
        edges.c.resolved,
    )
    # ``resolved`` as the caller found each dependency (add_to_workflow: an edge from a
    # completed step is resolved already); a retry of the step counts unresolved edges.
    edge_columns = ["depends_on_id", "job_id", "workflow_id", "run_on_failure", "resolved"]
    statement = statement.add_cte(
        pg_insert(dep_table).from_select(edge_columns, edge_rows).cte("inserted_edges")
    )
    if with_workflow_row:
        wf = json_recordset(_WORKFLOW, _WORKFLOW_COLUMNS, "workflow_row")
        wf_row = select(
            wf.c.id,
            wf.c.name,
            wf.c.on_dependency_failure,
            wf.c.total,
            wf.c.total,
            literal(0, Integer),
            wf.c.on_success_job_id,
            wf.c.on_complete_job_id,
            wf.c.on_failure_job_id,
        )
        columns = ["id", "name", "on_dependency_failure", "total", "unfinished", "failed"]
        columns += ["on_success_job_id", "on_complete_job_id", "on_failure_job_id"]
        statement = statement.add_cte(
            pg_insert(workflow_table).from_select(columns, wf_row).cte("inserted_workflow")
        )
    return statement.returning(Job.id)


def step_rows(rows: Sequence[JobRow]) -> None:
    """Refuse rows a step cannot be: unique, sequenced or keyed (by a kind's defaults;
    per-call options were refused when the step was added)."""
    for row in rows:
        for field, option in (("unique_key", "unique"), ("sequence_key", "sequence")):
            if row.get(field):
                hint = (
                    "pass unique=sa_jobs.UniqueOpts() to turn it off for the step"
                    if option == "unique"
                    else "use a kind without one for the step"
                )
                raise InvalidWorkflowError(
                    f"kind {row['kind']!r} is declared with {option}= options, and a workflow "
                    f"step cannot be {option}: a skipped duplicate or a waiting turn would "
                    f"leave the steps after it stuck; {hint}"
                )


@either_session
def insert_workflow(session: Session, workflow: Workflow) -> InsertedWorkflow:
    """Insert ``workflow`` — its row, its steps, their edges and its callbacks — in the
    session's transaction (committed or rolled back with it).

    Steps without dependencies are ``available`` (or ``scheduled``); the others, and the
    callbacks, wait as ``pending``. With an ``AsyncSession``, returns an awaitable.

    Raises:
        InvalidWorkflowError: an empty workflow, one inserted already, or a kind declared
            unique or sequenced. Nothing is written.
        SchemaMissingError: the ``sa_jobs_workflow`` branch is not installed.
    """
    if not workflow.steps:
        raise InvalidWorkflowError(
            f"workflow {workflow.name!r} has no steps; add some with workflow.add(args)"
        )
    if workflow.job_ids is not None:
        raise InvalidWorkflowError(
            f"workflow {workflow.name!r} was inserted already (id {workflow.id}); declare a "
            "new Workflow to insert another"
        )
    steps = workflow.steps
    rows = build_rows([(step.args, step.opts) for step in steps])
    step_rows(rows)
    roles = list(workflow.callbacks)
    callback_rows = build_rows([workflow.callbacks[role] for role in roles])
    connection = session.connection()
    all_rows = [*rows, *callback_rows]

    def write() -> tuple[int, list[int]]:
        # Inside the hooks' call: the rows' metadata is what the last before_insert left.
        with translate_missing_schema():
            require_workflows(connection)
            workflow_id, job_ids = connection.execute(_draw_ids(), {_COUNT: len(all_rows)}).one()
        job_ids = sorted(job_ids)
        _write_workflow(connection, workflow, workflow_id, job_ids, rows, callback_rows, roles)
        return workflow_id, job_ids

    workflow_id, job_ids = around_insert(all_rows, write, lambda written: written[1])
    step_ids, callback_ids = job_ids[: len(rows)], job_ids[len(rows) :]
    callback_of = dict(zip(roles, callback_ids, strict=True))
    workflow.id, workflow.job_ids = workflow_id, step_ids
    return InsertedWorkflow(
        workflow_id,
        {step.name: job_id for step, job_id in zip(steps, step_ids, strict=True)},
        callback_of,
    )


def around_insert(
    rows: Sequence[JobRow], write: Callable[[], W], ids_of: Callable[[W], Sequence[int]]
) -> W:
    """Run ``write`` inside the process's insert hooks (:mod:`sa_jobs.hooks`), as
    :func:`~sa_jobs._insert.insert.write_rows` does for plain inserts: a workflow's steps
    and callbacks are inserts like any other, and a hook that stamps, counts or traces
    inserts must see them. ``ids_of`` reads the rows' job ids, in order, from what
    ``write`` returned; every row is a new job (a step is never unique or keyed)."""
    hooks = INSERT_HOOKS.active
    if not hooks:
        return write()
    call = InsertCall(hooks, rows)
    call.begin()
    try:
        written = write()
    except BaseException as exc:
        call.end(None, exc)
        raise
    call.end((job_id, InsertAction.INSERTED) for job_id in ids_of(written))
    return written


def _write_workflow(
    connection: Connection,
    workflow: Workflow,
    workflow_id: int,
    job_ids: list[int],
    rows: Sequence[JobRow],
    callback_rows: Sequence[JobRow],
    roles: list[str],
) -> None:
    """The second round trip: the workflow row, its edges and its jobs."""
    steps = workflow.steps
    step_ids, callback_ids = job_ids[: len(rows)], job_ids[len(rows) :]
    sent: list[dict[str, Any]] = []
    for step, row, job_id in zip(steps, rows, step_ids, strict=True):
        sent.append(
            {
                **_core(row),
                "id": job_id,
                "pending": bool(step.after),
                "workflow_id": workflow_id,
                "workflow_step": step.name,
                "workflow_deps": len(step.after),
            }
        )
    for role, row, job_id in zip(roles, callback_rows, callback_ids, strict=True):
        metadata = {**row["metadata"], CALLBACK_KEY: {"workflow_id": workflow_id, "on": role}}
        sent.append({**_core(row), "metadata": metadata, "id": job_id, "pending": True})
    edges = [
        (step_ids[dep.index], step_ids[step.index], step.on_dependency_failure == "run")
        for step in steps
        for dep in step.after
    ]
    callback_of = dict(zip(roles, callback_ids, strict=True))
    wf_row = {
        "id": workflow_id,
        "name": workflow.name,
        "on_dependency_failure": workflow.on_dependency_failure,
        "total": len(steps),
        **{f"{role}_job_id": callback_of.get(role) for role in _ROLES},
    }
    with translate_missing_schema():
        connection.execute(
            _insert_statement(),
            {
                _ROWS: sent,
                _WF_ID: workflow_id,
                _WORKFLOW: [wf_row],
                _EDGE_FROM: [e[0] for e in edges],
                _EDGE_TO: [e[1] for e in edges],
                _EDGE_RUN: [e[2] for e in edges],
                _EDGE_RESOLVED: [False for _ in edges],
            },
        )


_ROLES = ("on_success", "on_complete", "on_failure")
_CORE_FIELDS = ("kind", "args", "queue", "priority", "max_attempts", "tags", "metadata")


def _core(row: JobRow) -> dict[str, Any]:
    values: dict[str, Any] = {field: row[field] for field in _CORE_FIELDS}  # type: ignore[literal-required]
    values["scheduled_at"] = row.get("scheduled_at")
    return values
