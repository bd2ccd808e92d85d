"""Adding a step to a workflow already in the database: :func:`add_to_workflow`.

The new step may wait for any step of the workflow, finished or not. Under the right
locks, so that no completion slips between reading a dependency and writing the edge:
the dependencies are locked ``FOR NO KEY UPDATE`` first (a completion's ``UPDATE`` of one
waits for this transaction, or this one reads its result) and the running ones get a new
row version (a completion whose snapshot predates the new edge then finishes them in a
transaction of its own, see
:func:`~sa_jobs._act.workflow_release.touch_running`), then the workflow row ``FOR
UPDATE`` (the order every completion takes them in: jobs, then the workflow). Then:

* a completed dependency's edge is written resolved;
* a failed (cancelled or discarded) one resolves it too when the step runs anyway
  (``on_dependency_failure="run"``); otherwise the step is cancelled at once by the usual
  cascade, with the reason in its metadata — the same end as had it been there before;
* the step is ``available`` (or ``scheduled``) when nothing is left to wait for, else
  ``pending``; the workflow's ``total`` and ``unfinished`` grow by one (a finished
  workflow is open again; callbacks that ran do not run again).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Unpack

import attrs
from sqlalchemy import BigInteger, Text, any_, bindparam, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from sa_jobs._act.workflow_release import FAILED_STATES, adjust_counters, cascade, touch_running
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import encode_args
from sa_jobs._declare.options import InsertOptions, InsertOpts, insert_opts
from sa_jobs._declare.workflow import (
    DependencyFailure,
    check_failure_mode,
    check_step_name,
    refuse_keyed_options,
)
from sa_jobs._insert.rows import build_rows
from sa_jobs._insert.workflow import (
    _COUNT,
    _EDGE_FROM,
    _EDGE_RESOLVED,
    _EDGE_RUN,
    _EDGE_TO,
    _ROWS,
    _WF_ID,
    _core,
    _draw_ids,
    _insert_statement,
    around_insert,
    require_workflows,
    step_rows,
)
from sa_jobs._table.models import Job
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs._table.workflow_tables import workflow_table
from sa_jobs.errors import InvalidWorkflowError, WorkflowNotFoundError

__all__ = ["AddedStep", "add_to_workflow"]


@attrs.frozen
class AddedStep:
    """The step :func:`add_to_workflow` wrote: its job id, name and state."""

    job_id: int
    name: str
    state: JobState


@either_session
def add_to_workflow(
    session: Session,
    workflow_id: int,
    args: object,
    *,
    after: Iterable[int | str] = (),
    name: str | None = None,
    on_dependency_failure: DependencyFailure | None = None,
    opts: InsertOpts | None = None,
    **options: Unpack[InsertOptions],
) -> AddedStep:
    """Add a step to workflow ``workflow_id``, in the session's transaction.

    ``after`` names the steps it waits for: step names, or job ids of steps of this
    workflow. ``name`` defaults to the kind, or ``kind.N`` (N: the step's position in the
    workflow) when a step already has that name. Options as for :meth:`Workflow.add`.

    Raises:
        WorkflowNotFoundError: no such workflow.
        InvalidWorkflowError: ``after`` names a job that is not a step of this workflow, or
            a step name it does not have; the name is taken; a unique/sequence/job_key
            option. Nothing is written.
    """
    kind, _ = encode_args(args)
    resolved_opts = insert_opts(opts, options)
    refuse_keyed_options(resolved_opts)
    rows = build_rows([(args, resolved_opts)])
    step_rows(rows)
    refs = list(after)
    ids = [ref for ref in refs if isinstance(ref, int) and not isinstance(ref, bool)]
    names = [ref for ref in refs if isinstance(ref, str)]
    if len(ids) + len(names) != len(refs):
        raise InvalidWorkflowError(
            f"after= takes step names or job ids of the workflow's steps, got {refs!r}"
        )
    connection = session.connection()
    with translate_missing_schema():
        require_workflows(connection)
    deps = connection.execute(
        select(Job.id, Job.state, Job.workflow_id, Job.workflow_step)
        .where(
            or_(
                Job.id == any_(bindparam("ids", ids, type_=ARRAY(BigInteger))),
                (Job.workflow_id == workflow_id)
                & (Job.workflow_step == any_(bindparam("names", names, type_=ARRAY(Text)))),
            )
        )
        .order_by(Job.id)
        .with_for_update(key_share=True)
    ).all()
    wf = connection.execute(
        select(workflow_table).where(workflow_table.c.id == workflow_id).with_for_update()
    ).one_or_none()
    if wf is None:
        raise WorkflowNotFoundError(workflow_id)
    _check_refs(workflow_id, ids, names, deps)
    touch_running(connection, [dep.id for dep in deps if dep.state is JobState.RUNNING])
    if name is None:
        name = kind.name
        if _taken(session, workflow_id, name):
            name = f"{kind.name}.{wf.total + 1}"
    check_step_name(name)
    if _taken(session, workflow_id, name):
        raise InvalidWorkflowError(
            f"workflow {workflow_id} already has a step named {name!r}; give this one another name="
        )
    mode = check_failure_mode(on_dependency_failure or wf.on_dependency_failure)
    run = mode == "run"
    resolved = [
        dep.state is JobState.COMPLETED or (run and dep.state in FAILED_STATES) for dep in deps
    ]
    waiting = resolved.count(False)

    def write() -> int:
        (_, (job_id,)) = connection.execute(_draw_ids(), {_COUNT: 1}).one()
        row = {
            **_core(rows[0]),
            "id": job_id,
            "pending": waiting > 0,
            "workflow_id": workflow_id,
            "workflow_step": name,
            "workflow_deps": waiting,
        }
        connection.execute(
            _insert_statement(with_workflow_row=False),
            {
                _ROWS: [row],
                _WF_ID: workflow_id,
                _EDGE_FROM: [dep.id for dep in deps],
                _EDGE_TO: [job_id for _ in deps],
                _EDGE_RUN: [run for _ in deps],
                _EDGE_RESOLVED: resolved,
            },
        )
        return int(job_id)

    # The insert hooks wrap the write alone: a refused reference above is a bad call,
    # not an insert that failed.
    job_id = around_insert(rows, write, lambda job_id: [job_id])
    connection.execute(
        update(workflow_table)
        .where(workflow_table.c.id == workflow_id)
        .values(total=workflow_table.c.total + 1, unfinished=workflow_table.c.unfinished + 1)
    )
    failed = [
        dep.id
        for dep, ok in zip(deps, resolved, strict=True)
        if not ok and dep.state in FAILED_STATES
    ]
    state = JobState.PENDING if waiting else _due_state(session, job_id)
    if failed:
        cancelled = cascade(connection, failed)
        adjust_counters(connection, {workflow_id: (-len(cancelled), len(cancelled))})
        state = JobState.CANCELLED
    return AddedStep(job_id, name, state)


def _check_refs(workflow_id: int, ids: list[int], names: list[str], deps: Any) -> None:
    by_id = {dep.id: dep for dep in deps}
    for job_id in ids:
        dep = by_id.get(job_id)
        if dep is None or dep.workflow_id != workflow_id:
            raise InvalidWorkflowError(
                f"after={job_id}: job {job_id} is not a step of workflow {workflow_id}"
                + (" (no such job)" if dep is None else "")
                + "; a step can only wait for steps of its own workflow"
            )
    found = {dep.workflow_step for dep in deps if dep.workflow_id == workflow_id}
    for step in names:
        if step not in found:
            raise InvalidWorkflowError(
                f"after={step!r}: workflow {workflow_id} has no step of that name"
            )


def _taken(session: Session, workflow_id: int, name: str) -> bool:
    return (
        session.scalar(
            select(Job.id).where(Job.workflow_id == workflow_id, Job.workflow_step == name)
        )
        is not None
    )


def _due_state(session: Session, job_id: int) -> JobState:
    return session.execute(select(Job.state).where(Job.id == job_id)).scalar_one()
