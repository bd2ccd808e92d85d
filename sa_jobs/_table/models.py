"""The jobs table: :class:`Job`, its core indexes, and the state helpers every query uses.

The feature branches' indexes are in :mod:`sa_jobs._table.feature_indexes`, the worker's
own tables (workers, leader, periodic schedule, queue controls) in
:mod:`sa_jobs._table.service_tables`.

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
    case,
    event,
    func,
    literal_column,
    null,
    text,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, BIT, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, QueryableAttribute, mapped_column
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.states import FINAL_STATES, InsertAction, JobState
from sa_jobs._declare.args import JobKind, default_registry
from sa_jobs._declare.output import decode_output
from sa_jobs.errors import JobStateError

__all__ = ["Base", "Job", "metadata"]

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

    def record_output(self, value: Any) -> None: ...

    def output_of(self, step: str) -> Any: ...

    async def record_output_async(self, value: Any) -> None: ...

    async def output_of_async(self, step: str) -> Any: ...


#: A job's args class.
A = TypeVar("A")

#: Marks args not decoded yet (None is a possible decode).
_NOT_DECODED: Any = object()
_EXTRAS = "_sa_jobs"

#: ``sa_job_refs(args)``: the references a job's args hold, as ``table:pk`` texts (every
#: JSON object with a string ``table`` and an array ``pk``, at any depth; the pk in
#: jsonb's canonical text). Installed by the ``sa_jobs_refs`` branch (sajobs_refs_0001,
#: which keeps its own copy of this text, as migrations do); ``create_all`` makes it
#: before the table (see the DDL event below).
REFS_FUNCTION = """
CREATE FUNCTION sa_job_refs(args jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(array_agg(DISTINCT (item ->> 'table') || ':' || (item -> 'pk')::text), '{}')
  FROM jsonb_path_query(args, 'strict $.**') AS item
  WHERE jsonb_typeof(item) = 'object'
    AND jsonb_typeof(item -> 'table') = 'string'
    AND jsonb_typeof(item -> 'pk') = 'array'
$$
"""
#: The refs index's predicate (``{args}``: how a statement names the args column); a
#: query must state it to use the index. Cheap where the function is not: jobs without
#: references are kept out of the index by a substring test of jsonb's text, whose
#: output always writes a key and an array value as ``"pk": [``. A false match costs
#: only the function's evaluation (which finds no reference).
REFS_PREDICATE = "strpos({args}::text, '\"pk\": [') > 0"


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
        deferred: An enqueued job whose args reference a pending instance: its args and
            options, encoded after the flush has given the instance its key.
    """

    args_of: Any = None
    args: Any = _NOT_DECODED
    kind: JobKind | None = None
    execution: Interruptible | None = None
    insert_action: InsertAction | None = None
    pending_row: Mapping[str, Any] | None = None
    order: int = -1
    deferred: tuple[Any, Any] | None = None


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

    # -- workflows (the sa_jobs_workflow branch), deferred like the other feature columns.
    #: The workflow this job is a step of (``sa_job_workflow.id``); NULL for other jobs.
    workflow_id: Mapped[int | None] = mapped_column(BigInteger, deferred=True)
    #: The step's name, unique in its workflow (``job.output_of(name)`` reads it).
    workflow_step: Mapped[str | None] = mapped_column(Text, deferred=True)
    #: Dependencies not resolved yet; the completion that brings it to 0 releases the step.
    workflow_deps: Mapped[int | None] = mapped_column(Integer, deferred=True)
    # -- recorded outputs (the sa_jobs_output branch), deferred like the other feature
    # columns: the fetch and insert paths never read them.
    #: What the handler returned (or recorded with :meth:`record_output`), as stored;
    #: :attr:`output` is it converted to the kind's ``output=`` type. SQL NULL: no output.
    output_json: Mapped[Any] = mapped_column(
        "output", JSONB(none_as_null=True), nullable=True, deferred=True
    )
    #: Set by :func:`sa_jobs.wait_for`: entering a final state notifies ``sa_jobs_done``.
    output_watched: Mapped[bool] = mapped_column(
        Boolean, server_default=text("false"), deferred=True
    )
    # -- partition keys (the sa_jobs_fairness branch), deferred like the other feature columns.
    #: The text of the args fields the kind's ``job_args(partition_by=...)`` names; NULL
    #: for a kind that names none. Limits by key and fair queues count and rotate by it.
    #: Collation "C": keys in code point order, the order a worker's cursor compares in.
    partition_key: Mapped[str | None] = mapped_column(Text(collation="C"), deferred=True)

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
        # Instants Python can read back in any time zone (sa_jobs._base.durations).
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
        # The sa_jobs_refs branch: the jobs that reference a row (``jobs_for``); partial,
        # so a job without references adds no entry (see REFS_FUNCTION).
        Index(
            "sa_job_refs_idx",
            text("sa_job_refs(args)"),
            postgresql_using="gin",
            postgresql_where=text(REFS_PREDICATE.format(args="args")),
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
        """The registered :class:`~sa_jobs._declare.args.JobKind` of this job."""
        kind = self.extras.kind
        return kind if kind is not None else default_registry.get(self.kind)

    @property
    def cancelled(self) -> bool:
        """True once the worker running this job asked it to stop (timeout, cancel, shutdown).

        Sync handlers should look at it (or call :meth:`check_cancelled`) between steps.
        """
        execution = self.extras.execution
        return execution is not None and execution.interrupted

    @property
    def output(self) -> Any:
        """The job's recorded output, converted to its kind's ``output=`` type; the stored
        JSON for a kind that declares none (or that this process does not know); None
        when it has none.

        Raises:
            sa_jobs.errors.InvalidOutputError: the stored JSON no longer fits the type.
        """
        data = self.output_json
        kind = self.extras.kind
        if kind is None and self.kind in default_registry:
            kind = default_registry.get(self.kind)
        return decode_output(kind, data)

    def record_output(self, value: Any) -> None:
        """Store ``value`` as this job's output now, in a short transaction of its own, so
        progress survives a crash of the worker. The handler's return value, if not None,
        replaces it when the job completes. Only while a worker runs the job. In an
        ``async def`` handler, ``await job.record_output_async(value)``.

        Raises:
            sa_jobs.errors.InvalidOutputError: ``value`` cannot be stored (see
                docs/results.md).
            sa_jobs.errors.JobStateError: the job is not being run by a worker here, or
                this run of it is over (timed out, rescued): nothing was written.
        """
        self._running("record the output of").record_output(value)

    def output_of(self, step: str) -> Any:
        """In a workflow step's (or a workflow callback's) handler: the output of the step
        named ``step`` of the same workflow, converted to its kind's ``output=`` type.

        Read on each call, with one query by the unique (workflow, step name) index. In
        an ``async def`` handler, ``await job.output_of_async(step)``.

        Raises:
            sa_jobs.errors.UnknownStepError: the job's workflow has no such step (or the
                job is not in a workflow).
            sa_jobs.errors.JobStateError: that step has not completed (a step that runs
                despite a failed dependency meets this for the failed one), or this job
                is not being run by a worker here.
        """
        return self._running("read a step's output for").output_of(step)

    async def record_output_async(self, value: Any) -> None:
        """:meth:`record_output` for an ``async def`` handler: the write runs on the
        worker's async engine and the event loop goes on meanwhile (the sync form, called
        from an ``async def`` handler, blocks the loop for its statement)."""
        await self._running("record the output of").record_output_async(value)

    async def output_of_async(self, step: str) -> Any:
        """:meth:`output_of` for an ``async def`` handler: read on the worker's async
        engine, without blocking the event loop."""
        return await self._running("read a step's output for").output_of_async(step)

    def _running(self, action: str) -> Interruptible:
        execution = self.extras.execution
        if execution is None:
            raise JobStateError(
                self.id,
                "not being run by a worker in this process",
                action,
                ["running in a worker's handler"],
            )
        return execution

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


def entering(next_state: JobState | ColumnElement[Any]) -> dict[str, Any]:
    """The values of a transition to ``next_state``: the state, and ``finalized_at`` set
    exactly when it is final — the one way every transition keeps the table's
    ``finalized_iff_final`` CHECK.

    ``next_state`` is a :class:`JobState` (the values are then plain: ``now()`` or NULL)
    or an expression giving a state's name, decided per row in SQL.
    """
    if isinstance(next_state, JobState):
        final = next_state in FINAL_STATES
        # The state as a literal, not a bound parameter (see _base.sql.constant).
        state = literal_column(f"'{next_state.value}'", job_state_type)
        return {"state": state, "finalized_at": func.now() if final else null()}
    # The final states as SQL literals, not a list parameter: SQLAlchemy renders a list
    # parameter into the statement's text at every execution (measured: 0.5 ms of client
    # CPU per run of the one-statement completion of steps, which has three).
    finals = [literal_column(f"'{state.value}'", Text) for state in sorted(FINAL_STATES)]
    return {
        "state": sql_cast(next_state, job_state_type),
        "finalized_at": case((next_state.in_(finals), func.now()), else_=null()),
    }


def state_is(
    state: ColumnElement[Any] | QueryableAttribute[Any], *states: JobState
) -> ColumnElement[bool]:
    """``state = 'available'`` (or ``state IN (...)``) with the states as SQL literals.

    The one way a query names states: a partial index on a state (the fetch, due,
    running and pending indexes) serves a condition only when the planner can prove it
    implies the index's predicate. A bound parameter proves nothing in a generic plan of
    a prepared statement (psycopg prepares a statement run five times; PostgreSQL may
    then plan it once for all values), and the plan falls back to a sequential scan —
    measured in docs/dev/performance-log.md. A literal is always seen.
    """
    literals = [literal_column(f"'{value.value}'", job_state_type) for value in states]
    if len(literals) == 1:
        return state == literals[0]
    return state.in_(literals)


_FEATURE_PREFIXES = (
    "unique_",
    "sequence_",
    "job_key",
    "revision",
    "workflow_",
    "output",
    "partition_key",
)

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


event.listen(job_table, "before_create", DDL(REFS_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(
    job_table,
    "after_drop",
    DDL("DROP FUNCTION IF EXISTS sa_job_refs(jsonb)"),  # type: ignore[no-untyped-call]
)
