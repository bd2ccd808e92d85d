"""Retrying a step: what it must wait for again, and the dependents it brings back.

:func:`sa_jobs._act.control.retry_one` and :func:`~sa_jobs._act.control.retry_ids` (so
``retry_job``, ``retry_jobs``, the dashboard and the CLI) call in here when the jobs they
retry are steps:

* :func:`retry_state` — a step whose dependencies have not all been resolved goes back to
  ``pending`` with ``workflow_deps`` recounted, never straight to ``available``.
* :func:`after_retried` — a retried step that had finished counts as unfinished again
  (and no longer failed); a failed one brings back the dependents the cascade cancelled
  because of it (``metadata.workflow_cancelled``), recursively, as ``pending`` with their
  counters recounted. A step brought back that still waits on another failed step is
  cancelled again by the usual cascade, so no step waits on a failure for ever.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Text,
    and_,
    any_,
    bindparam,
    case,
    exists,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.expression import CTE, ColumnElement

from sa_jobs._act.workflow_release import (
    CANCELLED_KEY,
    FAILED_STATES,
    adjust_counters,
    cascade,
    touch_running,
)
from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._table.models import Job, entering, job_table, state_is
from sa_jobs._table.workflow_tables import dep_table

__all__ = ["after_retried", "lock_for_retry", "retry_state", "unresolved_count"]

_IDS = "sa_jobs_wf_revive_ids"


def unresolved_count(jobs: Any = Job) -> ColumnElement[int]:
    """The number of unresolved edges into each row of ``jobs``."""
    return (
        select(func.count())
        .where(dep_table.c.job_id == jobs.id, ~dep_table.c.resolved)
        .scalar_subquery()
    )


def retry_state() -> dict[str, Any]:
    """The retry values for workflows: ``pending`` while a dependency is unresolved
    (plain jobs, whose ``workflow_id`` is NULL, keep ``available`` and NULL)."""
    waits = and_(
        Job.workflow_id.is_not(None),
        exists().where(dep_table.c.job_id == Job.id, ~dep_table.c.resolved),
    )
    return {
        **entering(case((waits, JobState.PENDING.value), else_=JobState.AVAILABLE.value)),
        "workflow_deps": case((Job.workflow_id.is_not(None), unresolved_count()), else_=None),
    }


def lock_for_retry(
    connection: Connection, job_ids: Sequence[int]
) -> dict[int, tuple[JobState, int]]:
    """Lock, in one id-ordered pass, the steps among ``job_ids`` and every step whose
    outcome the retry's counts depend on; their state before it and their workflow, by id.

    A retry counts the unresolved edges into the steps it retries and into the dependents
    it revives (:func:`after_retried`), while a dependency's completion may be in flight:
    that completion resolves its edge but releases only dependents *it* sees pending, so
    read under two snapshots a step could be left pending behind a resolved edge. Locked
    here are the retried steps, the cancelled dependents they may revive (recursively),
    and the unfinished dependencies of both: a completion already written is waited for
    (and later statements, each with a new snapshot, see it), and one not yet begun waits
    for this transaction. The running ones among them also get a new row version
    (:func:`~sa_jobs._act.workflow_release.touch_running`), so that a one-statement
    completion whose snapshot predates this retry leaves them to the writer's
    transactional path.

    One pass in id order, as every path takes job rows: two retries of two failed
    dependencies of one step each need the other's step, and take turns instead of
    deadlocking. (Those the locks reveal only after the wait — a step cancelled in the
    meantime by another failure — are not locked; the cascade after the revive cancels
    such a step again.)
    """
    rows = connection.execute(_lock_statement(), {_IDS: sorted(set(job_ids))}).all()
    touch_running(
        connection, [int(row.id) for row in rows if JobState(row.state) is JobState.RUNNING]
    )
    wanted = set(job_ids)
    return {
        int(row.id): (JobState(row.state), int(row.workflow_id)) for row in rows if row.id in wanted
    }


def _revivable() -> CTE:
    """The cancelled steps a retry of the steps in ``_IDS`` may bring back: those the
    cascade cancelled through an edge out of one of them, and recursively through theirs."""
    dep = dep_table
    cancelled = job_table.alias("cancelled_dependent")
    seed = (
        select(dep.c.job_id.label("id"))
        .join(cancelled, cancelled.c.id == dep.c.job_id)
        .where(
            dep.c.depends_on_id == any_(_ids()),
            ~dep.c.resolved,
            ~dep.c.run_on_failure,
            state_is(cancelled.c.state, JobState.CANCELLED),
            cancelled.c["metadata"].has_key(CANCELLED_KEY),
        )
    )
    revived = seed.cte("revived", recursive=True)
    edge = dep.alias("next_edge")
    later = job_table.alias("later_dependent")
    return revived.union(
        select(edge.c.job_id)
        .select_from(revived)
        .join(edge, edge.c.depends_on_id == revived.c.id)
        .join(later, later.c.id == edge.c.job_id)
        .where(
            ~edge.c.resolved,
            ~edge.c.run_on_failure,
            state_is(later.c.state, JobState.CANCELLED),
            later.c["metadata"].has_key(CANCELLED_KEY),
        )
    )


def _ids() -> Any:
    return bindparam(_IDS, type_=ARRAY(BigInteger))


@functools.cache
def _lock_statement() -> Any:
    """The rows :func:`lock_for_retry` locks: the steps in ``_IDS``, what a retry of them
    may revive, and the unresolved dependencies of both."""
    dep = dep_table
    revived = _revivable()
    waiting = (
        select(Job.id.label("id"))
        .where(Job.id == any_(_ids()), Job.workflow_id.is_not(None))
        .union(select(revived.c.id))
        .cte("waiting")
    )
    waited_on = select(dep.c.depends_on_id).where(
        dep.c.job_id.in_(select(waiting.c.id)), ~dep.c.resolved
    )
    every = select(waiting.c.id).union(waited_on).cte("to_lock")
    return (
        select(Job.id, Job.state, Job.workflow_id)
        .where(Job.id.in_(select(every.c.id)))
        .order_by(Job.id)
        .with_for_update()
    )


@functools.cache
def _revive_statement() -> Any:
    revived = _revivable()
    locked = (
        select(Job.id)
        .where(Job.id.in_(select(revived.c.id)), state_is(Job.state, JobState.CANCELLED))
        .order_by(Job.id)
        .with_for_update()
        .cte("revived_locked")
    )
    return (
        update(Job)
        .where(Job.id == locked.c.id, Job.metadata_.has_key(CANCELLED_KEY))
        .values(
            **entering(literal(JobState.PENDING.value, Text)),
            workflow_deps=unresolved_count(),
            metadata_=Job.metadata_.op("-")(literal(CANCELLED_KEY)),
        )
        .returning(Job.id, Job.workflow_id)
    )


@functools.cache
def _failed_dependencies() -> Any:
    """The failed steps that pending steps among ``ids`` still wait on."""
    dep = dep_table
    failed = job_table.alias("failed_dependency")
    waiting = job_table.alias("waiting_step")
    return (
        select(dep.c.depends_on_id)
        .distinct()
        .join(failed, failed.c.id == dep.c.depends_on_id)
        .join(waiting, waiting.c.id == dep.c.job_id)
        .where(
            dep.c.job_id == any_(bindparam(_IDS, type_=ARRAY(BigInteger))),
            ~dep.c.resolved,
            ~dep.c.run_on_failure,
            state_is(waiting.c.state, JobState.PENDING),
            failed.c.state.in_([state.value for state in FAILED_STATES]),
        )
    )


def after_retried(
    connection: Connection, before: dict[int, tuple[JobState, int]], retried: Sequence[int]
) -> None:
    """Steps among ``retried`` were just retried (``before``: their state before it)."""
    steps = [job_id for job_id in retried if job_id in before]
    if not steps:
        return
    unfinished: Counter[int] = Counter()
    failures: Counter[int] = Counter()
    for job_id in steps:
        state, wf = before[job_id]
        if state in FINAL_STATES:
            unfinished[wf] += 1
        if state in FAILED_STATES:
            failures[wf] -= 1
    was_failed = [job_id for job_id in steps if before[job_id][0] in FAILED_STATES]
    revived: list[tuple[int, int]] = []
    if was_failed:
        rows = connection.execute(_revive_statement(), {_IDS: sorted(was_failed)}).all()
        revived = [(int(job_id), int(wf)) for job_id, wf in rows]
    for _, wf in revived:
        unfinished[wf] += 1
        failures[wf] -= 1
    # Counted before the cascade below counts its own cancellations.
    adjust_counters(
        connection, {wf: (unfinished[wf], failures[wf]) for wf in set(unfinished) | set(failures)}
    )
    waiting = sorted({*steps, *(job_id for job_id, _ in revived)})
    still_failed = list(connection.scalars(_failed_dependencies(), {_IDS: waiting}))
    if still_failed:
        again = cascade(connection, sorted(still_failed))
        lost: Counter[int] = Counter(wf for _, wf in again)
        adjust_counters(connection, {wf: (-n, n) for wf, n in lost.items()})
