"""The tables: :class:`Job`, the worker and leader rows, and the indexes the queue relies on.

The model is the single description of the schema in Python; the Alembic scripts in
``sa_jobs/migrations`` create the same thing, and a test checks that autogenerate finds
no difference between the two.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs
from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    and_,
    case,
    event,
    func,
    null,
    text,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, BIT, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import ColumnElement, FromClause

from sa_jobs.args import JobKind, default_registry
from sa_jobs.states import FINAL_STATES, InsertAction, JobState

__all__ = ["Base", "Job", "JobQueue", "Leader", "PeriodicState", "WorkerProcess", "metadata"]

metadata = MetaData(
    naming_convention={
        "pk": "%(table_name)s_pkey",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "ix": "%(table_name)s_%(column_0_name)s_idx",
    }
)
"""sa_jobs' tables. Include this in your Alembic ``target_metadata`` (as a list entry) so
autogenerate knows sa_jobs' tables are expected and leaves them alone."""


class Base(DeclarativeBase):
    """Declarative base of sa_jobs' own tables (kept apart from the application's)."""

    metadata = metadata


job_state_type = Enum(
    JobState,
    name="sa_job_state",
    values_callable=lambda states: [state.value for state in states],
    validate_strings=True,
)


def _state_in(*states: JobState) -> str:
    return "state IN (" + ", ".join(f"'{state.value}'" for state in states) + ")"


class Interruptible(Protocol):
    """What a job sees of the worker's run of it (``sa_jobs.worker.execution.Execution``)."""

    @property
    def interrupted(self) -> bool: ...

    def raise_if_interrupted(self) -> None: ...


#: A job's args class.
A = TypeVar("A")

#: Marks args not decoded yet (None is a possible decode).
_NOT_DECODED: Any = object()
_EXTRAS = "_sa_jobs"


@attrs.define
class JobExtras:
    """What sa_jobs keeps on a :class:`Job` object beyond its columns (never stored).

    Attributes:
        args_of: The stored JSON that ``args`` was decoded from (the cache's key).
        args: The decoded args instance.
        kind: The kind the worker's handler decodes with (it may carry a converter of its
            own); the registry's otherwise.
        execution: The worker's run of this job, while it runs.
        insert_action: What the flush that inserted this object did.
        pending_row: An enqueued job's validated row, until its flush.
        order: When it was enqueued, so a flush inserts in program order.
    """

    args_of: Any = None
    args: Any = _NOT_DECODED
    kind: JobKind | None = None
    execution: Interruptible | None = None
    insert_action: InsertAction | None = None
    pending_row: Mapping[str, Any] | None = None
    order: int = -1


class Job(Base, Generic[A]):
    """One job row, generic in its args class: ``Job[SendEmail]`` has
    ``job.args: SendEmail`` to a type checker.

    ``job.args`` is the job args instance (decoded on first access); ``job.args_json``
    is what is stored. After an insert, ``job.unique_skipped_as_duplicate`` says whether
    the row already existed.
    """

    __tablename__ = "sa_job"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    args_json: Mapped[Any] = mapped_column("args", JSONB, server_default=text("'{}'::jsonb"))
    state: Mapped[JobState] = mapped_column(
        job_state_type, server_default=text("'available'::sa_job_state")
    )
    queue: Mapped[str] = mapped_column(Text, server_default=text("'default'::text"))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("1"))
    #: River's attempt: runs that counted against ``max_attempts`` (a snooze or a
    #: shutdown gives its attempt back).
    attempt: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(SmallInteger, server_default=text("25"))
    errors: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'::text[]"))
    scheduled_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    attempted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    attempted_by: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    finalized_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: How many times a worker started this job; never goes down. A run is identified by
    #: ``(id, run_count)``, so a late result of an earlier run is never written.
    run_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))

    # -- unique jobs (the sa_jobs_unique branch). Deferred: a database without that branch
    # never has these columns selected, so the core works there unchanged.
    unique_key: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    #: One bit per JobState, in declaration order: the states in which this job blocks
    #: duplicates.
    unique_states: Mapped[str | None] = mapped_column(BIT(8), deferred=True)
    #: Faktory's TTL: from this time on the job no longer blocks duplicates.
    unique_expires_at: Mapped[dt.datetime | None] = mapped_column(
        DateTime(timezone=True), deferred=True
    )
    #: Release the key when the job starts (Faktory's ``unique_until: start``).
    unique_until_start: Mapped[bool] = mapped_column(
        Boolean, server_default=text("false"), deferred=True
    )

    # -- sequences (the sa_jobs_sequence branch), deferred like the unique columns.
    sequence_key: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    #: This job holds its sequence's one slot: it is the active job, or the cancelled or
    #: discarded job that halted the sequence.
    sequence_slot: Mapped[bool] = mapped_column(
        Boolean, server_default=text("false"), deferred=True
    )
    sequence_continue_on_cancelled: Mapped[bool] = mapped_column(
        Boolean, server_default=text("false"), deferred=True
    )
    sequence_continue_on_discarded: Mapped[bool] = mapped_column(
        Boolean, server_default=text("false"), deferred=True
    )

    # -- job keys (the sa_jobs_job_key branch), deferred like the other feature columns.
    #: Graphile Worker's job key: at most one job holds it. Cleared when the job completes
    #: or is cancelled, and taken from a running job that a new add replaces.
    job_key: Mapped[str | None] = mapped_column(Text, deferred=True)
    #: Graphile's revision: 0 when created, +1 each time an add replaces it in place.
    revision: Mapped[int] = mapped_column(Integer, server_default=text("0"), deferred=True)

    __table_args__ = (
        CheckConstraint("priority BETWEEN 1 AND 4", name="priority"),
        CheckConstraint("max_attempts > 0", name="max_attempts"),
        CheckConstraint("attempt >= 0", name="attempt"),
        CheckConstraint("char_length(kind) BETWEEN 1 AND 128", name="kind_length"),
        CheckConstraint("char_length(queue) BETWEEN 1 AND 128", name="queue_length"),
        CheckConstraint("cardinality(tags) <= 64", name="tags_count"),
        CheckConstraint("jsonb_typeof(args) IN ('object', 'array')", name="args_type"),
        CheckConstraint("jsonb_typeof(metadata) = 'object'", name="metadata_type"),
        CheckConstraint("jsonb_typeof(errors) = 'array'", name="errors_type"),
        CheckConstraint(
            f"({_state_in(*sorted(FINAL_STATES))}) = (finalized_at IS NOT NULL)",
            name="finalized_iff_final",
        ),
        # Instants Python can read back in any time zone (sa_jobs.durations).
        *(
            CheckConstraint(
                f"{column} BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'",
                name=f"{column}_range",
            )
            for column in ("scheduled_at", "created_at")
        ),
        # The fetch query reads this index in order and stops at the batch size.
        Index(
            "sa_job_fetch_idx",
            "queue",
            "priority",
            "scheduled_at",
            "id",
            postgresql_where=text(_state_in(JobState.AVAILABLE)),
        ),
        # The scheduler's "what is due" scan.
        Index(
            "sa_job_due_idx",
            "scheduled_at",
            postgresql_where=text(_state_in(JobState.SCHEDULED, JobState.RETRYABLE)),
        ),
        # The rescuer's scan of running jobs, without reading finished history.
        Index(
            "sa_job_running_idx",
            "attempted_at",
            postgresql_where=text(_state_in(JobState.RUNNING)),
        ),
        # The cleaner's retention scan.
        Index(
            "sa_job_finalized_idx",
            "state",
            "finalized_at",
            postgresql_where=text("finalized_at IS NOT NULL"),
        ),
        # Vacuumed after 1 % of the rows changed rather than 20 %: the dead versions
        # every job leaves sit in the fetch index ahead of the live ones, and on a table
        # of millions of finished jobs 20 % is a long wait (migration sajobs_core_0005).
        {"postgresql_with": {"autovacuum_vacuum_scale_factor": "0.01"}},
    )

    #: Set by the insert paths: True when the insert found an existing duplicate.
    unique_skipped_as_duplicate: bool = False

    @property
    def extras(self) -> JobExtras:
        """What sa_jobs keeps on this object beyond its columns (never stored)."""
        found: JobExtras | None = self.__dict__.get(_EXTRAS)
        if found is None:
            # ORM-loaded objects skip __init__, so the holder is made on first use.
            found = self.__dict__[_EXTRAS] = JobExtras()
        return found

    @property
    def insert_action(self) -> InsertAction | None:
        """After ``session.add(enqueue(...))`` and a flush: what the insert did; None for
        jobs loaded from the database."""
        return self.extras.insert_action

    @property
    def args(self) -> A:
        """The job args instance (an instance of the class registered for ``kind``)."""
        stored = self.args_json
        extras = self.extras
        # The cache belongs to the stored JSON it was made from: a refresh or a job-key
        # replace brings new JSON, and with it a new decode.
        if extras.args_of is not stored or extras.args is _NOT_DECODED:
            extras.args_of, extras.args = stored, self.job_kind.decode(stored)
        args: A = extras.args
        return args

    def remember_args(self, args: object) -> None:
        """Record that ``args`` is what :attr:`args_json` decodes to (saves a decode)."""
        extras = self.extras
        extras.args_of, extras.args = self.args_json, args

    @property
    def job_kind(self) -> JobKind:
        """The registered :class:`~sa_jobs.args.JobKind` of this job."""
        kind = self.extras.kind
        return kind if kind is not None else default_registry.get(self.kind)

    @property
    def cancelled(self) -> bool:
        """True once the worker running this job asked it to stop (timeout, cancel, shutdown).

        Sync handlers should look at it (or call :meth:`check_cancelled`) between steps.
        """
        execution = self.extras.execution
        return execution is not None and execution.interrupted

    def check_cancelled(self) -> None:
        """Raise the reason this job was asked to stop, if it was.

        Raises:
            sa_jobs.errors.JobInterruptedError: a subclass saying why (timeout, cancelled,
                worker shutdown).
        """
        execution = self.extras.execution
        if execution is not None:
            execution.raise_if_interrupted()

    def __repr__(self) -> str:
        state = self.state.value if isinstance(self.state, JobState) else self.state
        return f"<Job id={self.id} kind={self.kind!r} state={state} queue={self.queue!r}>"


job_table: Table = Job.__table__  # type: ignore[assignment]


def entering(next_state: ColumnElement[Any]) -> dict[str, Any]:
    """The values of a transition to ``next_state`` (an expression giving a state's name):
    the state, and ``finalized_at`` set exactly when it is final — the one way every
    transition keeps the table's ``finalized_iff_final`` CHECK."""
    finals = [state.value for state in FINAL_STATES]
    return {
        "state": sql_cast(next_state, job_state_type),
        "finalized_at": case((next_state.in_(finals), func.now()), else_=null()),
    }


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
        job_table.c.sequence_key.is_not(None), job_table.c.state == JobState.PENDING
    ),
)

#: At most one job per job key.
job_key_index = Index(
    "sa_job_job_key_idx",
    job_table.c.job_key,
    unique=True,
    postgresql_where=job_table.c.job_key.is_not(None),
)

_FEATURE_PREFIXES = ("unique_", "sequence_", "job_key", "revision")

#: The boolean every insert statement returns beside the job's columns: true when the
#: statement met an existing job (a unique duplicate, or a job key's holder).
EXISTED_COLUMN = "unique_skipped_as_duplicate"
#: The columns every installation has; the insert and fetch paths return only these.
CORE_COLUMNS = tuple(c for c in job_table.c if not c.name.startswith(_FEATURE_PREFIXES))

# The unique index's predicate calls this function, so metadata.create_all() (tests,
# autogenerate comparisons) must create it first. The Alembic script has its own copy.
STATE_IN_BITMASK_FUNCTION = """
CREATE OR REPLACE FUNCTION sa_job_state_in_bitmask(bitmask bit(8), state sa_job_state)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT get_bit(bitmask, CASE state
        WHEN 'available' THEN 0 WHEN 'scheduled' THEN 1 WHEN 'pending' THEN 2
        WHEN 'running' THEN 3 WHEN 'retryable' THEN 4 WHEN 'completed' THEN 5
        WHEN 'cancelled' THEN 6 WHEN 'discarded' THEN 7 END) = 1
$$
"""
event.listen(job_table, "before_create", DDL(STATE_IN_BITMASK_FUNCTION))  # type: ignore[no-untyped-call]


@functools.cache
def states_bitmask(states: frozenset[JobState]) -> str:
    """The ``unique_states`` bit string for ``states`` (bit i is the i-th JobState)."""
    return "".join("1" if state in states else "0" for state in JobState)


class WorkerProcess(Base):
    """A live worker process; its heartbeat tells the rescuer its jobs are not orphaned."""

    __tablename__ = "sa_job_worker"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(BigInteger)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    heartbeat_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class Leader(Base):
    """The one worker process currently running maintenance; the lease expires if it dies."""

    __tablename__ = "sa_job_leader"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    leader_id: Mapped[str] = mapped_column(Text)
    elected_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class PeriodicState(Base):
    """The durable schedule of one periodic job (the ``sa_jobs_periodic`` branch).

    ``next_run_at`` is the one instant not yet fired; a tick moves it forward with a
    compare-and-set in the transaction that inserts the instant's job, so each instant
    gets one job whatever the number of processes (``docs/periodic-jobs.md``).
    """

    __tablename__ = "sa_job_periodic"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    #: The schedule's canonical text; a process started later with another one in its
    #: code starts the job over from it.
    schedule: Mapped[str] = mapped_column(Text)
    next_run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    #: The latest instant fired, and the job and (database) time it was inserted at.
    last_run_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    last_enqueued_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: ``sa_jobs.periodic.run_now`` asks for an extra run; the next tick honours it.
    run_now_requested_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: The start instant of the process whose code set ``schedule``: only a process
    #: started later may replace it, once, at its start (``docs/periodic-jobs.md``).
    schedule_set_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: Last time a worker with this periodic job in its code registered or ticked it;
    #: rows not seen for ``periodic_retire_after`` are deleted.
    seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class JobQueue(Base):
    """A queue's controls (the ``sa_jobs_queue`` branch): a row exists once a queue was
    paused, and stays after it is resumed, so later per-queue settings have a home.

    A queue without a row is simply active: queues are made by the jobs put in them.
    """

    __tablename__ = "sa_job_queue"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Set while the queue is paused: no worker fetches from it (the fetch statement
    #: itself checks), inserts still succeed, running jobs finish.
    paused_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (CheckConstraint("char_length(name) BETWEEN 1 AND 128", name="name_length"),)
