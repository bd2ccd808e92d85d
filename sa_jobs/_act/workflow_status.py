"""Looking at and stopping a workflow: :func:`workflow_status`, :func:`cancel_workflow`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobs._act.control import cancel_ids
from sa_jobs._act.workflow_release import CANCELLED_KEY, FAILED_STATES
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._insert.workflow import require_workflows
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs._table.workflow_tables import workflow_table
from sa_jobs.errors import WorkflowNotFoundError

__all__ = ["FailedStep", "WorkflowStatus", "cancel_workflow", "workflow_status"]

#: How many failed steps :func:`workflow_status` lists (the counts cover them all).
FAILED_STEPS_LISTED = 100

_ROLES = ("on_success", "on_complete", "on_failure")


@attrs.frozen
class FailedStep:
    """A step that was cancelled or discarded; ``because`` is the job id of the failed
    dependency that cascaded to it (None for a step that failed by itself)."""

    name: str
    job_id: int
    state: JobState
    because: int | None
    errors: int


@attrs.frozen
class WorkflowStatus:
    """A workflow at one instant.

    Attributes:
        counts: Steps per state (every state present, zeros included).
        unfinished, failed: The workflow's own counters (what fires the callbacks).
        failed_steps: Up to 100 failed steps, in id order.
        callbacks: Each callback's ``(job id, state)`` by role.
    """

    id: int
    name: str
    created_at: dt.datetime
    finished_at: dt.datetime | None
    total: int
    unfinished: int
    failed: int
    counts: Mapping[JobState, int]
    failed_steps: Sequence[FailedStep]
    callbacks: Mapping[str, tuple[int, JobState]]

    @property
    def finished(self) -> bool:
        """Every step is in a final state."""
        return self.unfinished == 0

    @property
    def succeeded(self) -> bool:
        """Every step completed."""
        return self.counts[JobState.COMPLETED] == self.total


def _workflow_row(session: Session, workflow_id: int) -> Any:
    connection = session.connection()
    with translate_missing_schema():
        require_workflows(connection)
    row = connection.execute(
        select(workflow_table).where(workflow_table.c.id == workflow_id)
    ).one_or_none()
    if row is None:
        raise WorkflowNotFoundError(workflow_id)
    return row


@either_session
def workflow_status(session: Session, workflow_id: int) -> WorkflowStatus:
    """Counts per state, the failed steps and the callbacks of a workflow (read through
    the steps' ``workflow_id`` index; not meant for a hot loop over huge batches).

    Raises:
        WorkflowNotFoundError: no such workflow.
    """
    row = _workflow_row(session, workflow_id)
    connection = session.connection()
    counts = {state: 0 for state in JobState}
    for state, n in connection.execute(
        select(Job.state, func.count()).where(Job.workflow_id == workflow_id).group_by(Job.state)
    ):
        counts[JobState(state)] = int(n)
    failed_rows = connection.execute(
        select(
            Job.id,
            Job.workflow_step,
            Job.state,
            Job.metadata_[CANCELLED_KEY]["because"].as_integer(),
            func.jsonb_array_length(Job.errors),
        )
        .where(
            Job.workflow_id == workflow_id,
            state_is(Job.state, *FAILED_STATES),
        )
        .order_by(Job.id)
        .limit(FAILED_STEPS_LISTED)
    ).all()
    failed_steps = [
        FailedStep(step or "", int(job_id), JobState(state), because, int(errors))
        for job_id, step, state, because, errors in failed_rows
    ]
    ids = {role: getattr(row, f"{role}_job_id") for role in _ROLES}
    states = dict(
        connection.execute(
            select(Job.id, Job.state).where(Job.id.in_([i for i in ids.values() if i]))
        ).all()
    )
    callbacks = {
        role: (job_id, JobState(states[job_id]))
        for role, job_id in ids.items()
        if job_id is not None and job_id in states
    }
    return WorkflowStatus(
        id=row.id,
        name=row.name,
        created_at=row.created_at,
        finished_at=row.finished_at,
        total=row.total,
        unfinished=row.unfinished,
        failed=row.failed,
        counts=counts,
        failed_steps=failed_steps,
        callbacks=callbacks,
    )


@either_session
def cancel_workflow(session: Session, workflow_id: int) -> int:
    """Cancel every unfinished step of a workflow, and its callbacks that have not run.

    Steps waiting or due are ``cancelled`` at once; running ones are asked to stop, as
    :func:`sa_jobs.cancel_job` does. Callbacks are cancelled first, in the same
    statement, so none fires when the workflow's last step ends. Finished steps stay as
    they are (retrying one later revives the workflow, without its callbacks).

    Returns:
        The number of jobs changed (cancelled, or asked to stop).

    Raises:
        WorkflowNotFoundError: no such workflow.
    """
    row = _workflow_row(session, workflow_id)
    finals = [state.value for state in FINAL_STATES]
    ids = list(
        session.scalars(
            select(Job.id).where(Job.workflow_id == workflow_id, Job.state.not_in(finals))
        )
    )
    ids += [getattr(row, f"{role}_job_id") for role in _ROLES if getattr(row, f"{role}_job_id")]
    return len(cancel_ids(session, sorted(ids)))
