"""The jobs list: its filters, and one bounded page of it.

A page never reads more than :data:`SCAN_WINDOW` rows, and which rows it reads depends
on the filter:

* **A state** (alone or with other filters): the page walks the partial index that
  holds exactly that state's jobs, in that index's order, keyset-paginated on its
  columns — ``sa_job_fetch_idx`` for ``available`` (fetch order: queue, priority,
  scheduled_at, id), ``sa_job_due_idx`` for ``scheduled`` and ``retryable`` (soonest due
  first), ``sa_job_running_idx`` for ``running`` (longest running first),
  ``sa_job_finalized_idx`` for finished states (most recently finished first),
  ``sa_job_sequence_pending_idx`` for ``pending``. So three old ``available`` jobs behind
  millions of newer finished ones are on the first page: the overview's count links
  always lead to the jobs they count.
* **No state** (kind, tag, text or queue alone): newest first along the primary key
  (``id < :before``), looking at the newest :data:`SCAN_WINDOW` rows below the cursor.
  There is no index for these filters (it would cost every insert and every state
  change), so a rare match may take a few *search older jobs* clicks.

Either way, a page that ran out of its window before finding a page of matches says how
far it searched, and its "next" link carries on from there.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import Select, Text, func, select, tuple_
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table, state_is
from sa_jobs._table.schema import Features
from sa_jobs.dashboard.list_filter import FilterError, ListFilter

__all__ = [
    "PAGE_SIZE",
    "SCAN_WINDOW",
    "JobListRow",
    "JobPage",
    "StateOrder",
    "list_jobs",
    "page_statement",
    "parse_instant",
]

PAGE_SIZE = 50
#: Rows of the table (or of one state's index) one page of the jobs list reads, at most.
SCAN_WINDOW = 50_000
ARGS_PREVIEW = 160


@attrs.frozen
class JobListRow:
    id: int
    kind: str
    queue: str
    state: JobState
    attempt: int
    max_attempts: int
    priority: int
    tags: Sequence[str]
    created_at: dt.datetime
    scheduled_at: dt.datetime
    finalized_at: dt.datetime | None
    #: When its last attempt started, and the worker that ran it (``attempted_by``'s last).
    attempted_at: dt.datetime | None
    worker: str | None
    args_preview: str
    last_error: str | None
    #: When its last error was recorded (the record's ``at``), if it has one.
    last_error_at: dt.datetime | None = None

    @property
    def run_time(self) -> dt.timedelta | None:
        """How long its last run took, for a finished job; None when it never ran.

        From ``attempted_at`` to the run's end: the last error's time when that error
        ended this run (a job that failed and was cancelled while it waited to retry was
        finalized long after it stopped running), else ``finalized_at``.
        """
        if self.attempted_at is None or self.finalized_at is None:
            return None
        ended = self.finalized_at
        if self.last_error_at is not None and self.attempted_at <= self.last_error_at < ended:
            ended = self.last_error_at
        return max(ended - self.attempted_at, dt.timedelta(0))


@attrs.frozen
class JobPage:
    """One page of the jobs list.

    Attributes:
        rows: The jobs, in ``order``.
        next: The query parameters of the next page (``before=`` an id, or ``after=`` a
            state page's cursor), or None at the end.
        searched_to: Set when the page is short because it read its whole window: the
            id of the last job it looked at (``next`` searches on from there).
        order: The order of the rows, for people ("newest first").
    """

    rows: Sequence[JobListRow]
    next: Mapping[str, str] | None
    searched_to: int | None = None
    order: str = "newest first"


# ---------------------------------------------------------------------- state orders


@attrs.frozen
class StateOrder:
    """How one state's jobs are paged: along the partial index that holds just them.

    Attributes:
        columns: The sort key, the index's columns then ``id`` (unique, so the keyset
            cursor is exact).
        descending: Newest first (finished jobs) rather than oldest first.
        index: The index the page walks (checked by a test against the plan).
        queue_in_index: ``queue`` leads the index: a queue filter narrows the walk.
        description: The order, for people.
    """

    columns: tuple[str, ...]
    descending: bool
    index: str
    description: str
    queue_in_index: bool = False


_FINISHED = StateOrder(
    ("finalized_at", "id"), True, "sa_job_finalized_idx", "most recently finished first"
)
STATE_ORDERS: dict[JobState, StateOrder] = {
    JobState.AVAILABLE: StateOrder(
        ("queue", "priority", "scheduled_at", "id"),
        False,
        "sa_job_fetch_idx",
        "in fetch order (queue, priority, scheduled time)",
        queue_in_index=True,
    ),
    JobState.SCHEDULED: StateOrder(
        ("scheduled_at", "id"), False, "sa_job_due_idx", "soonest due first"
    ),
    JobState.RETRYABLE: StateOrder(
        ("scheduled_at", "id"), False, "sa_job_due_idx", "soonest due first"
    ),
    JobState.RUNNING: StateOrder(
        ("attempted_at", "id"), False, "sa_job_running_idx", "longest running first"
    ),
    JobState.COMPLETED: _FINISHED,
    JobState.CANCELLED: _FINISHED,
    JobState.DISCARDED: _FINISHED,
    JobState.PENDING: StateOrder(
        ("sequence_key", "id"), False, "sa_job_sequence_pending_idx", "by sequence, in order"
    ),
}

#: The columns a page reads (the core ones: a page works on a database with only the
#: core branch installed).
_LISTED = (
    "id",
    "kind",
    "queue",
    "state",
    "attempt",
    "max_attempts",
    "priority",
    "tags",
    "created_at",
    "scheduled_at",
    "finalized_at",
    "attempted_at",
    "attempted_by",
    "args",
    "errors",
)


def _state_is(state: JobState) -> ColumnElement[bool]:
    # A literal, not a bound parameter: the planner must see that the condition implies
    # the partial index's predicate even in a generic plan of a prepared statement.
    return state_is(job_table.c.state, state)


def _index_conditions(jobs_filter: ListFilter, order: StateOrder) -> list[ColumnElement[bool]]:
    assert jobs_filter.state is not None
    found = [_state_is(jobs_filter.state)]
    # The rest of the partial index's predicate: the planner cannot infer it from the
    # state (it does not reason with CHECK constraints), and would not use the index.
    if order.index == "sa_job_finalized_idx":
        found.append(job_table.c.finalized_at.is_not(None))
    if jobs_filter.state is JobState.PENDING:
        found.append(job_table.c.sequence_key.is_not(None))
    if order.queue_in_index and jobs_filter.queue:
        found.append(job_table.c.queue == jobs_filter.queue)
    return found


def _keyset(order: StateOrder, after: Sequence[Any] | None) -> list[ColumnElement[bool]]:
    if after is None:
        return []
    key = tuple_(*(job_table.c[name] for name in order.columns))
    given = tuple_(*after)
    return [key < given if order.descending else key > given]


def _sorted(columns: Any, order: StateOrder) -> list[Any]:
    return [columns[name].desc() if order.descending else columns[name] for name in order.columns]


#: Prefix of the labels of a state page's sort key in its rows (the next page's cursor).
KEY = "key_"


def _page(
    scanned: Any,
    jobs_filter: ListFilter,
    order_by: list[Any],
    page_size: int,
    keys: Sequence[str] = (),
) -> Select[Any]:
    """Matches of ``jobs_filter`` among the rows of ``scanned`` (a window subquery), with
    the sort key ``keys`` of each."""
    return (
        select(
            scanned.c.id,
            scanned.c.kind,
            scanned.c.queue,
            scanned.c.state,
            scanned.c.attempt,
            scanned.c.max_attempts,
            scanned.c.priority,
            scanned.c.tags,
            scanned.c.created_at,
            scanned.c.scheduled_at,
            scanned.c.finalized_at,
            scanned.c.attempted_at,
            # PostgreSQL arrays count from 1: the last element is at its cardinality.
            scanned.c.attempted_by[func.cardinality(scanned.c.attempted_by)].label("worker"),
            func.left(sql_cast(scanned.c.args, Text), ARGS_PREVIEW).label("args_preview"),
            scanned.c.errors[-1]["error"].astext.label("last_error"),
            scanned.c.errors[-1]["at"].astext.label("last_error_at"),
            *(scanned.c[name].label(KEY + name) for name in keys),
        )
        .where(*jobs_filter.conditions(scanned))
        .order_by(*order_by)
        .limit(page_size + 1)
    )


def page_statement(
    jobs_filter: ListFilter,
    cursor: Sequence[Any] | int | None = None,
    *,
    page_size: int = PAGE_SIZE,
    window: int | None = None,
) -> Select[Any]:
    """The statement of one page: ``page_size + 1`` matches (one more says there are
    more), among at most ``window`` rows after ``cursor`` (a state page's sort key, or
    for a page without a state the id the page starts below)."""
    window = SCAN_WINDOW if window is None else window
    if jobs_filter.state is None:
        assert cursor is None or isinstance(cursor, int)
        scanned = _id_window(cursor, window, _extra(jobs_filter)).subquery("scanned")
        return _page(scanned, jobs_filter, [scanned.c.id.desc()], page_size)
    assert not isinstance(cursor, int)
    order = STATE_ORDERS[jobs_filter.state]
    columns = dict.fromkeys((*_LISTED, *order.columns, *_extra(jobs_filter)))
    scanned = (
        select(*(job_table.c[name] for name in columns))
        .where(*_index_conditions(jobs_filter, order), *_keyset(order, cursor))
        .order_by(*_sorted(job_table.c, order))
        .limit(window)
        .subquery("scanned")
    )
    # The window already holds only this state (and queue, when the index leads with it).
    rest = attrs.evolve(
        jobs_filter, state=None, queue="" if order.queue_in_index else jobs_filter.queue
    )
    return _page(scanned, rest, _sorted(scanned.c, order), page_size, order.columns)


def _extra(jobs_filter: ListFilter) -> tuple[str, ...]:
    """Columns the window must carry for the filter beyond the listed ones (only then:
    ``partition_key`` exists with the sa_jobs_fairness branch alone)."""
    return ("partition_key",) if jobs_filter.key else ()


def _id_window(before: int | None, size: int, extra: tuple[str, ...] = ()) -> Select[Any]:
    """The newest ``size`` jobs below ``before``, read backwards along the primary key."""
    statement = (
        select(*(job_table.c[name] for name in (*_LISTED, *extra)))
        .order_by(job_table.c.id.desc())
        .limit(size)
    )
    if before is not None:
        statement = statement.where(job_table.c.id < before)
    return statement


def list_jobs(
    session: Session,
    jobs_filter: ListFilter,
    before: int | None = None,
    *,
    after: str = "",
    page_size: int = PAGE_SIZE,
    window: int | None = None,
) -> JobPage:
    """A page of jobs matching ``jobs_filter``.

    Without a state: newest first, ids below ``before``. With one: in its index's order
    (:data:`STATE_ORDERS`), after the cursor ``after`` (from a previous page's ``next``).

    Raises:
        FilterError: an ``after`` cursor this filter's pages do not make.
    """
    window = SCAN_WINDOW if window is None else window
    if jobs_filter.ref and not Features.of(session.connection()).refs:
        raise FilterError("filtering by a referenced row needs the sa_jobs_refs branch")
    if jobs_filter.ref and not Features.of(session.connection()).refs:
        raise FilterError("filtering by a referenced row needs the sa_jobs_refs branch")
    if jobs_filter.state is None:
        return _list_by_id(session, jobs_filter, before, page_size, window)
    order = STATE_ORDERS[jobs_filter.state]
    if jobs_filter.state is JobState.PENDING and not Features.of(session.connection()).sequence:
        return JobPage([], None, order=order.description)  # no sequences, no pending jobs
    cursor = decode_cursor(after, order) if after else None
    found = session.execute(
        page_statement(jobs_filter, cursor, page_size=page_size, window=window)
    ).all()
    rows = [_row(row) for row in found[:page_size]]
    if len(found) > page_size:
        last = found[page_size - 1]._mapping
        key = [last[KEY + name] for name in order.columns]
        return JobPage(rows, {"after": encode_cursor(key)}, order=order.description)
    # A short page: the state's jobs ended within the window, or the window ran out.
    boundary = session.execute(
        select(*(job_table.c[name] for name in order.columns))
        .where(*_index_conditions(jobs_filter, order), *_keyset(order, cursor))
        .order_by(*_sorted(job_table.c, order))
        .offset(window - 1)
        .limit(1)
    ).first()
    if boundary is None:
        return JobPage(rows, None, order=order.description)
    return JobPage(
        rows,
        {"after": encode_cursor(boundary)},
        searched_to=boundary[-1],
        order=order.description,
    )


def _list_by_id(
    session: Session, jobs_filter: ListFilter, before: int | None, page_size: int, window: int
) -> JobPage:
    found = session.execute(
        page_statement(jobs_filter, before, page_size=page_size, window=window)
    ).all()
    rows = [_row(row) for row in found[:page_size]]
    if len(found) > page_size:
        return JobPage(rows, {"before": str(rows[-1].id)})
    if not jobs_filter.active:
        return JobPage(rows, None)  # the window held every row there was
    # Fewer matches than a page: either the table ends within the window, or the
    # window ran out first — then say where, so the next page searches on from there.
    boundary = session.scalar(
        select(job_table.c.id)
        .where(*([job_table.c.id < before] if before is not None else []))
        .order_by(job_table.c.id.desc())
        .offset(window - 1)
        .limit(1)
    )
    if boundary is None:
        return JobPage(rows, None)
    return JobPage(rows, {"before": str(boundary)}, searched_to=boundary)


def _row(row: Any) -> JobListRow:
    values = dict(row._mapping)
    values["last_error_at"] = parse_instant(values["last_error_at"])
    return JobListRow(**{field.name: values[field.name] for field in attrs.fields(JobListRow)})


def parse_instant(text: object) -> dt.datetime | None:
    """An error record's ``at`` (JSON text written by PostgreSQL), or None when it is
    missing or not an aware ISO 8601 time (records come from whoever wrote the row)."""
    if not isinstance(text, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


# ---------------------------------------------------------------------- cursors


def encode_cursor(key: Sequence[Any]) -> str:
    """A state page's sort key as an opaque, URL-safe token."""
    values = [
        value.isoformat()
        if isinstance(value, dt.datetime)
        else bytes(value).hex()
        if isinstance(value, bytes | memoryview)
        else value
        for value in key
    ]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def decode_cursor(token: str, order: StateOrder) -> tuple[Any, ...]:
    """The sort key in ``token``, typed for ``order``'s columns.

    Raises:
        FilterError: not a cursor of this order.
    """
    try:
        padded = token + "=" * (-len(token) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(values, list) or len(values) != len(order.columns):
            raise ValueError
        return tuple(_typed(name, value) for name, value in zip(order.columns, values, strict=True))
    except (ValueError, TypeError, binascii.Error):
        raise FilterError(f"{token[:40]!r} is not a page of this list (start again)") from None


def _typed(column: str, value: Any) -> Any:
    if column in ("id", "priority"):
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) >= 2**63:
            raise ValueError
        return value
    if column == "queue" and isinstance(value, str):
        return value
    if column == "sequence_key" and isinstance(value, str):
        return bytes.fromhex(value)
    if column.endswith("_at") and isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError
        return parsed
    raise ValueError
