"""What goes with a workflow's jobs when they are deleted: their edges, and the workflow.

The cleaner (retention) and :func:`~sa_jobs.delete_jobs` delete jobs; for the steps
among them, in the same transaction, :func:`forget_deleted_steps` deletes

* every edge into or out of a deleted step (``sa_job_dep``'s primary key serves the
  edges out, ``sa_job_dep_job_id_idx`` the edges in);
* the row of each workflow that lost a step and is now finished with no step left
  (``unfinished = 0`` and nothing in ``sa_job_workflow_id_idx``), together with its
  callbacks still ``pending`` — an ``on_success`` that a failure left waiting, which
  nothing can release once no step is left to retry.

The work is bounded by the batch of jobs deleted: only the workflows of those jobs are
looked at, so a pass never scans ``sa_job_workflow``. The cleaner itself keeps the
finished steps of an unfinished workflow (:func:`kept_by_workflow`): its pending steps
may still read their outputs with ``output_of``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    any_,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.workflow_tables import dep_table, workflow_table

__all__ = ["forget_deleted_steps", "kept_by_workflow"]

_STEPS = "sa_jobs_deleted_steps"
_WORKFLOWS = "sa_jobs_deleted_workflows"


def _ids(name: str) -> Any:
    return bindparam(name, type_=ARRAY(BigInteger))


def kept_by_workflow() -> ColumnElement[bool]:
    """True for a job the cleaner keeps because it is a step of an unfinished workflow.

    Plain jobs stop at ``workflow_id IS NULL`` (an ``OR`` is evaluated left to right), so
    they cost no lookup of the workflow row."""
    unfinished = exists().where(
        workflow_table.c.id == Job.workflow_id, workflow_table.c.unfinished > 0
    )
    return ~or_(Job.workflow_id.is_(None), ~unfinished)


@functools.cache
def _edges_statement() -> Any:
    return delete(dep_table).where(
        or_(
            dep_table.c.depends_on_id == any_(_ids(_STEPS)),
            dep_table.c.job_id == any_(_ids(_STEPS)),
        )
    )


@functools.cache
def _workflows_statement() -> Any:
    """Delete the finished workflows of ``_WORKFLOWS`` left without a step and, by a
    second data-modifying CTE, their still-pending callbacks (PostgreSQL runs every
    data-modifying CTE, read or not); returns how many workflow rows went."""
    wf = workflow_table
    gone = (
        delete(wf)
        .where(
            wf.c.id == any_(_ids(_WORKFLOWS)),
            wf.c.unfinished == 0,
            ~exists().where(Job.workflow_id == wf.c.id),
        )
        .returning(wf.c.on_success_job_id, wf.c.on_complete_job_id, wf.c.on_failure_job_id)
        .cte("sa_jobs_workflows_gone")
    )
    callback_ids = union_all(*(select(column) for column in gone.c))
    callbacks = (
        delete(Job)
        .where(Job.id.in_(callback_ids), state_is(Job.state, JobState.PENDING))
        .cte("sa_jobs_callbacks_gone")
    )
    return select(func.count()).select_from(gone).add_cte(callbacks)


def forget_deleted_steps(connection: Connection, deleted: Iterable[tuple[int, int | None]]) -> int:
    """Jobs ``(id, workflow_id)`` were deleted in this transaction: delete their edges and
    the workflows now finished and empty (see the module); returns how many workflows
    went. Plain jobs are ignored."""
    steps = [(job_id, wf) for job_id, wf in deleted if wf is not None]
    if not steps:
        return 0
    connection.execute(_edges_statement(), {_STEPS: sorted(job_id for job_id, _ in steps)})
    workflows = sorted({wf for _, wf in steps if wf is not None})
    return int(connection.execute(_workflows_statement(), {_WORKFLOWS: workflows}).scalar_one())
