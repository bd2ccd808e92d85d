"""The feature branches' indexes and constraints on ``sa_job``: unique keys (and their
TTL locks), sequences' slots and pending jobs, job keys, workflow steps, partition keys.

Each is the Python twin of an index a migration branch creates, declared on
:data:`~sa_jobs._table.models.job_table` so autogenerate finds no difference; the insert
paths hand :data:`unique_index` and :data:`job_key_index` to ``ON CONFLICT``, and every
query that needs an index's predicate builds it from the function beside it. Importing
``sa_jobs`` (which any ``sa_jobs.*`` import does first) registers them all.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Index, and_, func, text
from sqlalchemy.sql.expression import ColumnElement, FromClause

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table, state_is

__all__ = [
    "holds_ttl_lock",
    "holds_unique_key",
    "job_key_index",
    "partition_index",
    "sequence_active_holds_slot",
    "sequence_pending_index",
    "sequence_slot_index",
    "unique_index",
    "unique_ttl_index",
    "workflow_index",
    "workflow_pending_index",
]


def holds_unique_key(jobs: FromClause) -> ColumnElement[bool]:
    """True for rows of ``jobs`` (the table or an alias) that block their key's duplicates."""
    return and_(
        jobs.c.unique_key.is_not(None),
        jobs.c.unique_states.is_not(None),
        func.sa_job_state_in_bitmask(jobs.c.unique_states, jobs.c.state),
    )


#: At most one job per unique key among jobs in their own unique states. The insert paths
#: pass this Index to ON CONFLICT, and every other query that needs the predicate builds
#: it with holds_unique_key(), so it is written once.
unique_index = Index(
    "sa_job_unique_idx",
    job_table.c.unique_key,
    unique=True,
    postgresql_where=holds_unique_key(job_table),
)


def holds_ttl_lock(jobs: FromClause) -> ColumnElement[bool]:
    """True for rows of ``jobs`` that hold their unique key under a TTL (Faktory's lock)."""
    return and_(holds_unique_key(jobs), jobs.c.unique_expires_at.is_not(None))


#: The holders whose lock can expire, by when it does. Inserts look here first for one
#: lock that has expired, so while none has, they spend nothing on releasing (unique.py).
unique_ttl_index = Index(
    "sa_job_unique_ttl_idx",
    job_table.c.unique_expires_at,
    postgresql_where=holds_ttl_lock(job_table),
)

#: Every sequence job that is active holds its sequence's slot; with the unique slot
#: index below, at most one job of a sequence can be active.
sequence_active_holds_slot = CheckConstraint(
    "sequence_key IS NULL OR sequence_slot OR state NOT IN "
    "('available', 'running', 'retryable', 'scheduled')",
    name="sequence_active_holds_slot",
)
job_table.append_constraint(sequence_active_holds_slot)

#: At most one slot holder per sequence key.
sequence_slot_index = Index(
    "sa_job_sequence_slot_idx",
    job_table.c.sequence_key,
    unique=True,
    postgresql_where=and_(job_table.c.sequence_key.is_not(None), job_table.c.sequence_slot),
)
#: The next job of a sequence: its lowest pending id.
sequence_pending_index = Index(
    "sa_job_sequence_pending_idx",
    job_table.c.sequence_key,
    job_table.c.id,
    postgresql_where=and_(
        job_table.c.sequence_key.is_not(None), state_is(job_table.c.state, JobState.PENDING)
    ),
)

#: At most one job per job key.
job_key_index = Index(
    "sa_job_job_key_idx",
    job_table.c.job_key,
    unique=True,
    postgresql_where=job_table.c.job_key.is_not(None),
)

#: One step per name in a workflow; how output_of() and workflow_status() find its steps.
workflow_index = Index(
    "sa_job_workflow_id_idx",
    job_table.c.workflow_id,
    job_table.c.workflow_step,
    unique=True,
    postgresql_where=job_table.c.workflow_id.is_not(None),
)

#: The steps waiting for their dependencies, by queue: what stats() and the Prometheus
#: gauges count (``sajobs_workflow_0002``); sequences' pending jobs are not in it.
workflow_pending_index = Index(
    "sa_job_workflow_pending_idx",
    job_table.c.queue,
    postgresql_where=and_(
        job_table.c.state == JobState.PENDING, job_table.c.workflow_id.is_not(None)
    ),
)

#: The available jobs that have a partition key, per queue and key in fetch order: what a
#: keyed fetch walks (sa_jobs.worker.keyed_fetch). Jobs without a key add no entry.
partition_index = Index(
    "sa_job_partition_idx",
    job_table.c.queue,
    job_table.c.partition_key,
    job_table.c.priority,
    job_table.c.scheduled_at,
    job_table.c.id,
    postgresql_where=text("state = 'available' AND partition_key IS NOT NULL"),
)
