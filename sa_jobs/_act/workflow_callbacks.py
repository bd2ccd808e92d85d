"""A workflow's callbacks: jobs inserted with it, ``pending``, released when it finishes.

The transaction that brings a workflow's ``unfinished`` counter to 0 (its row lock makes
that one transaction) calls :func:`fire_callbacks`:

* ``on_complete`` is released: every step finished, whatever the outcome.
* ``on_failure`` is released if a step failed (cancelled or discarded), cancelled if none
  did. It fires at the end, not at the first failure: like Sidekiq's ``complete``, the
  callback sees the whole outcome, and a batch with a thousand failures calls it once.
* ``on_success`` is released if no step failed. Otherwise it stays ``pending``: retrying
  the failed steps can still bring the workflow to success (Sidekiq's ``success`` waits
  the same way); ``cancel_workflow`` cancels it.

A callback is released only from ``pending``, so it runs at most once however often the
workflow is revived and finishes again. A released callback's ``metadata["workflow"]``
holds the counts at that moment: ``{"id", "name", "total", "completed", "failed"}``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    Text,
    any_,
    bindparam,
    case,
    column,
    func,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.expression import CTE, ColumnElement

from sa_jobs._base.sql import constant, id_array, json_recordset
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, entering, state_is
from sa_jobs._table.schema import INSERT_CHANNEL
from sa_jobs._table.workflow_tables import CALLBACK_KEY

__all__ = [
    "CALLBACK_KEY",
    "COUNTS_KEY",
    "callbacks_fired",
    "fire_callbacks",
    "id_array",
    "release_state",
]

#: ``metadata`` key a released callback finds the workflow's counts under.
COUNTS_KEY = "workflow"

_RELEASES = "sa_jobs_wf_callbacks"
_RELEASE_IDS = "sa_jobs_wf_callback_ids"
_CANCELS = "sa_jobs_wf_callback_cancels"


def release_state(jobs: Any = Job) -> ColumnElement[Any]:
    """The state a released job (a step or a callback) enters: ``scheduled`` while not
    due, else ``available``. ``clock_timestamp()``, not ``now()``: ``now()`` is when the
    transaction began, and a job inserted since would wrongly look scheduled."""
    return case(
        (jobs.scheduled_at > func.clock_timestamp(), constant(JobState.SCHEDULED.value)),
        else_=constant(JobState.AVAILABLE.value),
    )


@functools.cache
def _release_statement() -> Any:
    source = json_recordset(
        _RELEASES, [column("id", BigInteger), column("counts", JSONB)], "callbacks"
    )
    released = (
        update(Job)
        .where(
            Job.id == source.c.id,
            # The same ids again, as an array: the planner then reads sa_job by its primary
            # key whatever join it picks. Joined only to the recordset (estimated at 100
            # rows), it sat at the tipping point of a hash join over the whole table.
            Job.id == any_(bindparam(_RELEASE_IDS, type_=ARRAY(BigInteger))),
            state_is(Job.state, JobState.PENDING),
        )
        .values(
            **entering(release_state()),
            metadata_=Job.metadata_.op("||")(func.jsonb_build_object(COUNTS_KEY, source.c.counts)),
        )
        .returning(Job.state, Job.queue)
        .cte("released_callbacks")
    )
    notify = func.pg_notify(INSERT_CHANNEL, released.c.queue).cast(Text)
    return select(
        func.count(), func.max(case((state_is(released.c.state, JobState.AVAILABLE), notify)))
    ).select_from(released)


@functools.cache
def _cancel_statement() -> Any:
    return (
        update(Job)
        .where(
            Job.id == any_(bindparam(_CANCELS, type_=ARRAY(BigInteger))),
            state_is(Job.state, JobState.PENDING),
        )
        .values(**entering(literal(JobState.CANCELLED.value, Text)))
    )


def callbacks_fired(counters: CTE) -> CTE:
    """:func:`fire_callbacks` as CTEs of the statement that moved the counters:
    ``counters`` is that ``UPDATE``'s ``RETURNING`` (the columns :func:`fire_callbacks`
    reads, and ``finished_now``). Returns a one-row CTE to join, which runs the releases
    (and their notifications) and the cancellations."""
    done = counters.c.finished_now
    counts = func.jsonb_build_object(
        constant("id"),
        counters.c.id,
        constant("name"),
        counters.c.name,
        constant("total"),
        counters.c.total,
        constant("completed"),
        counters.c.total - counters.c.failed,
        constant("failed"),
        counters.c.failed,
    )
    # on_complete always; on_failure if a step failed, else on_success.
    second = case(
        (counters.c.failed > constant(0), counters.c.on_failure_job_id),
        else_=counters.c.on_success_job_id,
    )
    firing = union_all(
        *(
            select(job_id.label("id"), counts.label("counts")).where(done, job_id.is_not(None))
            for job_id in (counters.c.on_complete_job_id, second)
        )
    ).cte("callbacks_firing")
    # The ids as an array too, for a primary-key read (see _release_statement).
    ids = id_array(select(func.array_agg(firing.c.id)))
    locked = (
        select(Job.id, firing.c.counts)
        .join(firing, Job.id == firing.c.id)
        .where(Job.id == any_(ids), state_is(Job.state, JobState.PENDING))
        .order_by(Job.id)
        .with_for_update(of=Job)
        .cte("callbacks_locked")
    )
    released = (
        update(Job)
        .where(
            Job.id == locked.c.id,
            Job.id == any_(id_array(select(func.array_agg(locked.c.id)))),
            state_is(Job.state, JobState.PENDING),
        )
        .values(
            **entering(release_state()),
            metadata_=Job.metadata_.op("||")(
                func.jsonb_build_object(constant(COUNTS_KEY), locked.c.counts)
            ),
        )
        .returning(Job.state, Job.queue)
        .cte("callbacks_released")
    )
    # on_failure is cancelled when no step failed: on_success fired instead.
    unneeded = id_array(
        select(func.array_agg(counters.c.on_failure_job_id)).where(
            done, counters.c.failed == constant(0), counters.c.on_failure_job_id.is_not(None)
        )
    )
    cancelled = (
        update(Job)
        .where(Job.id == any_(unneeded), state_is(Job.state, JobState.PENDING))
        .values(**entering(constant(JobState.CANCELLED.value)))
        .returning(Job.id)
        .cte("callbacks_cancelled")
    )
    notify = func.pg_notify(constant(INSERT_CHANNEL), released.c.queue).cast(Text)
    return (
        select(
            func.count().label("released"),
            func.max(case((state_is(released.c.state, JobState.AVAILABLE), notify))).label(
                "notified"
            ),
            select(func.count()).select_from(cancelled).scalar_subquery().label("cancelled"),
        )
        .select_from(released)
        .cte("callbacks_fired")
    )


def fire_callbacks(connection: Connection, finished: Sequence[Row[Any]]) -> None:
    """Workflows whose last step just finished (rows of ``sa_job_workflow`` with
    ``id, name, total, failed`` and the callback ids): release or cancel their callbacks."""
    releases: list[dict[str, Any]] = []
    cancels: list[int] = []
    for wf in finished:
        counts = {
            "id": wf.id,
            "name": wf.name,
            "total": wf.total,
            "completed": wf.total - wf.failed,
            "failed": wf.failed,
        }
        fire = [wf.on_complete_job_id]
        if wf.failed:
            fire.append(wf.on_failure_job_id)
        else:
            fire.append(wf.on_success_job_id)
            if wf.on_failure_job_id is not None:
                cancels.append(wf.on_failure_job_id)
        releases.extend({"id": job_id, "counts": counts} for job_id in fire if job_id is not None)
    if releases:
        releases.sort(key=_by_id)
        connection.execute(
            _release_statement(),
            {_RELEASES: releases, _RELEASE_IDS: [entry["id"] for entry in releases]},
        )
    if cancels:
        connection.execute(_cancel_statement(), {_CANCELS: sorted(cancels)})


def _by_id(entry: dict[str, Any]) -> int:
    job_id: int = entry["id"]
    return job_id
