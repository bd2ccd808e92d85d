"""The records every layer passes around: a row to insert, a run's outcome, an insert's result.

A leaf beside :mod:`sa_jobs._base.states`: defining these here, not in the insert and
completion code that makes them, lets the hooks and the integrations built on them
(:mod:`sa_jobs.hooks`, :mod:`sa_jobs.otel`, :mod:`sa_jobs.prometheus`) see them without
importing that code. :class:`~sa_jobs.Job` is named in annotations only (never imported at
run time), so this module imports nothing of sa_jobs but :mod:`sa_jobs._base.states`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import attrs

from sa_jobs._base.states import InsertAction

if TYPE_CHECKING:
    from sa_jobs._table.models import Job

__all__ = ["Ending", "InsertResult", "JobRow", "Outcome", "in_sequence"]


class JobRow(TypedDict, total=False):
    """One job to insert. Feature fields are present only when the job uses them."""

    kind: str
    args: Any
    queue: str
    priority: int
    max_attempts: int
    tags: list[str]
    metadata: dict[str, Any]
    #: ISO 8601, or None for "now" (on the database clock).
    scheduled_at: str | None
    #: ``\\x``-prefixed hex of the key digest (see sa_jobs._declare.unique_sequence_keys).
    unique_key: str
    #: Only when they differ from the defaults (the statement fills those in).
    unique_states: str
    unique_ttl: float
    unique_until_start: bool
    sequence_key: str
    sequence_continue_on_cancelled: bool
    sequence_continue_on_discarded: bool
    job_key: str
    job_key_mode: str
    #: The kind's ``partition_by`` fields as text (sa_jobs._declare.partitions).
    partition_key: str


class Ending(enum.StrEnum):
    """How a run ended, as the worker saw it."""

    COMPLETED = "completed"
    #: Failed: retryable, or discarded when no attempts are left (decided in SQL).
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Discarded at once, attempts left or not (``JobDiscard``; a referenced row gone).
    DISCARDED = "discarded"
    #: Run again after ``delay`` without spending an attempt (a snooze).
    SNOOZED = "snoozed"
    #: Interrupted by shutdown: available again at once, attempt given back.
    RETURNED = "returned"


@attrs.frozen
class Outcome:
    """The result of one run, ready to be written."""

    job_id: int
    #: The run this outcome belongs to (the job's ``run_count`` when it was fetched).
    run: int
    ending: Ending
    #: Seconds from now (database clock) until the job is due again.
    delay: float | None = None
    #: Appended to the job's ``errors``.
    error: dict[str, Any] | None = None
    #: Whether the job is in a sequence; None when unknown (treated as maybe).
    sequenced: bool | None = None
    #: Whether the job is a workflow step (or callback); None when unknown (treated as
    #: maybe). A step's completion, its release of dependents and its workflow's
    #: counters must commit together, so the writer needs a transaction for it.
    in_workflow: bool | None = None
    #: A completion's output, as the JSON to store (``sa_jobs._declare.output``); None:
    #: none (an output recorded earlier in the run stays).
    output: Any = attrs.field(default=None, eq=False, repr=False)
    #: The job this outcome is for, when the writer has it (not written; lets a writer
    #: that cannot store the outcome fail the job with its retry policy instead).
    job: Job[Any] | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, job: Job[Any], ending: Ending, **details: Any) -> Outcome:
        """An outcome for this run of ``job``."""
        return cls(
            job.id,
            job.run_count,
            ending,
            sequenced=in_sequence(job),
            in_workflow=in_workflow(job),
            job=job,
            **details,
        )

    @classmethod
    def completed(cls, job: Job[Any]) -> Outcome:
        return cls.of(job, Ending.COMPLETED)


def in_workflow(job: Job[Any]) -> bool | None:
    """Whether a job is a workflow step, if its row was loaded with ``workflow_id``."""
    if "workflow_id" not in job.__dict__:
        return None
    return job.__dict__["workflow_id"] is not None


def in_sequence(job: Job[Any]) -> bool | None:
    """Whether a job is sequenced, if its row was loaded with ``sequence_key``."""
    if "sequence_key" not in job.__dict__:
        return None
    return job.__dict__["sequence_key"] is not None


A = TypeVar("A")


@attrs.frozen
class InsertResult(Generic[A]):
    """What an insert did.

    Attributes:
        job: The inserted job, or the existing one it met.
        unique_skipped_as_duplicate: True when an existing unique job made this insert a
            no-op (River's flag; the same as ``action is SKIPPED_DUPLICATE``).
        action: Inserted, skipped as a duplicate, or — with a job key — replaced or
            deduplicated.
        revision: With a job key, Graphile's revision of the job (0 when created, one
            more per update in place).
    """

    job: Job[A]
    unique_skipped_as_duplicate: bool = False
    action: InsertAction = InsertAction.INSERTED
    #: With a job key: the job's revision (0 when created, +1 per update in place);
    #: None for jobs without a key.
    revision: int | None = None
