"""Fetching from a queue under limits that hold across every worker process.

A queue with no limit (no :class:`~sa_jobs.ConcurrencyLimit` or
:class:`~sa_jobs.RateLimit` on it, and none on a kind) is fetched by
:func:`~sa_jobs.worker.producer.fetch_jobs`, one statement, exactly as without this
module. A limited queue is fetched here, in one transaction:

1. **Lock.** A transaction-scoped advisory lock per scope the fetch enforces (the queue,
   and every limited kind), taken in one order so fetchers never deadlock. Every fetch
   of a scope takes its lock, so fetches of one scope run one at a time, across
   processes; each holds the lock until it commits.
2. **Count** (:func:`limits_usage`), in a statement that begins after the locks are
   held. Under READ COMMITTED each statement sees every transaction committed before it
   began, so it sees every earlier fetch of the scope: the running jobs of the scope, and
   the starts recorded in the rate windows. Nothing else makes a job ``running`` (only a
   fetch does; finishing only lowers the count), so the count is exact or high, never low,
   until this transaction commits. The ``clock_timestamp()`` it reads is the fetch's
   time: later than every earlier fetch's, as they committed before it began. On
   psycopg 3 the locks and the count are sent with BEGIN as one query
   (:mod:`.opening`): still statements of their own, run in this order.
3. **Fetch** (:func:`jobs_fetch_limited`) at most what the limits allow: the queue's
   allowance is the batch size, and a kind's allowance caps its rows in the batch (a
   window over the locked rows). A kind whose allowance is spent is left out of the scan,
   so its jobs never stand in the way of other kinds'; when a kind reaches its cap with
   rows left over, the fetch runs again without it (at most once per limited kind).
4. **Record** the starts in the rate windows of the rate-limited scopes, and commit,
   which releases the locks.

So after every fetch of a scope, its running jobs number at most ``max_running`` and
its starts in any ``per``-long stretch at most ``max_starts`` (the argument for the
sliding window is in ``docs/queues.md``, "Limits").
"""

from __future__ import annotations

import datetime as dt
import functools
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    Integer,
    Interval,
    Select,
    Text,
    all_,
    bindparam,
    column,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningUpdate

from sa_jobs._base.states import JobState
from sa_jobs._declare.limits import ConcurrencyLimit, Limit, LimitScope, RateLimit
from sa_jobs._table.job_loading import detached_job_builder
from sa_jobs._table.limit_tables import RateWindow
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import Features
from sa_jobs.worker.opening import opened_transaction
from sa_jobs.worker.producer import (
    FETCH_ORDER,
    due_in_queue,
    fetched_columns,
    in_start_order,
    running_values,
)

__all__ = [
    "LOCK_CLASS",
    "WINDOWS_PER_PERIOD",
    "Allowance",
    "QueueLimits",
    "ScopeRule",
    "count_starts",
    "fetch_limited",
    "jobs_fetch_limited",
    "limits_usage",
    "lock_scopes",
    "plan_limits",
    "record_starts",
    "window_of",
]

#: The first half of every limit lock, ``pg_advisory_xact_lock(LOCK_CLASS, n)`` (the
#: sequence locks use another class, so the two never meet).
LOCK_CLASS = 0x5A_11_0001
#: A rate period is counted in this many windows: the count errs on the safe side by at
#: most one window (a twentieth of the period), and a scope keeps ~21 rows.
WINDOWS_PER_PERIOD = 20
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


@attrs.frozen
class ScopeRule:
    """Every limit this process declared on one scope."""

    scope: LimitScope
    max_running: int | None = None
    max_starts: int | None = None
    per: dt.timedelta | None = None
    #: The limits count per partition key (``by_args``): :mod:`.keyed_fetch` counts them.
    by_key: bool = False

    @property
    def key(self) -> str:
        """What the rule's lock and rate windows are named by: the scope's key, and
        ``#key`` for a rule by key (a lock of its own: per limit, counted per key)."""
        return f"{self.scope.key}#key" if self.by_key else self.scope.key

    @property
    def lock_number(self) -> int:
        """The second half of the scope's advisory lock: a stable hash of its key (two
        scopes sharing one only wait for each other more than they need to)."""
        return int.from_bytes(zlib.crc32(self.key.encode()).to_bytes(4), signed=True)

    def allowance(self, running: int, starts: int) -> int:
        """How many more jobs of the scope may start now."""
        allowed = []
        if self.max_running is not None:
            allowed.append(self.max_running - running)
        if self.max_starts is not None:
            allowed.append(self.max_starts - starts)
        return max(0, min(allowed))


@attrs.frozen
class QueueLimits:
    """What a fetch of one queue enforces: the queue's own limits and every kind's."""

    queue: str
    #: In lock order.
    rules: tuple[ScopeRule, ...]

    @property
    def rated(self) -> tuple[ScopeRule, ...]:
        return tuple(rule for rule in self.rules if rule.max_starts is not None and not rule.by_key)

    @property
    def keyed(self) -> tuple[ScopeRule, ...]:
        """The rules by partition key (each counted per key, :mod:`.keyed_fetch`)."""
        return tuple(rule for rule in self.rules if rule.by_key)


def plan_limits(limits: Iterable[Limit], queues: Iterable[str]) -> dict[str, QueueLimits]:
    """The limits each queue's fetch enforces; a queue left out is fetched as usual."""
    by_scope: dict[tuple[LimitScope, bool], dict[str, Any]] = {}
    for limit in limits:
        by_key = limit.key_spec is not None
        values = by_scope.setdefault((limit.scope, by_key), {})
        if isinstance(limit, ConcurrencyLimit):
            values["max_running"] = limit.max_running
        elif isinstance(limit, RateLimit):
            values.update(max_starts=limit.max_starts, per=limit.per)
    rules = [
        ScopeRule(scope, **values, by_key=by_key) for (scope, by_key), values in by_scope.items()
    ]
    plans = {}
    for queue in queues:
        mine = [r for r in rules if r.scope.by == "kind" or r.scope.name == queue]
        if mine:
            mine.sort(key=lambda rule: (rule.lock_number, rule.key))
            plans[queue] = QueueLimits(queue, tuple(mine))
    return plans


@functools.cache
def lock_scopes(limits: QueueLimits) -> Select[Any]:
    """Take the advisory lock of every scope of ``limits``, in their order (the count of
    an ordered subquery, as :mod:`sa_jobs._insert.sequence` takes its locks)."""
    numbers = sorted({rule.lock_number for rule in limits.rules})
    unnested = func.unnest(bindparam("lock_numbers", numbers, ARRAY(Integer)))
    number = unnested.table_valued("n").render_derived(name="lock_numbers")
    ordered = select(number.c.n).order_by(number.c.n).subquery("ordered_lock_numbers")
    return select(func.count(func.pg_advisory_xact_lock(LOCK_CLASS, ordered.c.n)))


@functools.cache
def limits_usage(limits: QueueLimits) -> Select[Any]:
    """The fetch's time (``at``), and per rule ``i`` the scope's running jobs
    (``running_i``) and its starts in the windows that end inside its period
    (``starts_i``). Sound only after :func:`lock_scopes`, in a later statement.

    ``at`` is ``clock_timestamp()``, read once (a derived table with a volatile function
    is never pulled up), while this statement runs: after the locks are held, so later
    than the time of every earlier fetch of the scopes. Not ``statement_timestamp()``:
    that is when the client's message arrived, and the opening query
    (:mod:`.opening`) carries the locks and this count in one message, so it would be a
    time from before the locks were granted, and fetches' times would not increase."""
    moment = select(func.clock_timestamp().label("at")).subquery("fetch_time")
    at = moment.c.at
    columns: list[Any] = [at]
    for i, rule in enumerate(limits.rules):
        if rule.by_key:
            continue  # counted per key (keyed_fetch.key_usage)
        if rule.max_running is not None:
            grouped = Job.queue if rule.scope.by == "queue" else Job.kind
            running = (
                select(func.count())
                .select_from(Job)
                .where(
                    state_is(Job.state, JobState.RUNNING),
                    grouped == bindparam(f"scope_{i}", rule.scope.name, Text),
                )
            )
            columns.append(running.scalar_subquery().label(f"running_{i}"))
        if rule.per is not None:
            starts = select(func.coalesce(func.sum(RateWindow.starts), 0)).where(
                RateWindow.scope == bindparam(f"key_{i}", rule.scope.key, Text),
                RateWindow.window_end > at - bindparam(f"per_{i}", rule.per, Interval),
            )
            columns.append(starts.scalar_subquery().label(f"starts_{i}"))
    return select(*columns).select_from(moment)


@functools.cache
def jobs_fetch_limited(features: Features) -> ReturningUpdate[Any]:
    """:func:`~sa_jobs.worker.producer.jobs_fetch_available` under limits.

    Binds, besides the fetch's ``:fetch_queue``, ``:fetch_limit`` (the queue's
    allowance) and ``:fetch_worker_id``: ``:full_kinds`` (kinds whose allowance is spent:
    not scanned), ``:capped_kinds`` and ``:kind_caps`` (at most that many rows of each of
    those kinds; rows over a cap stay locked but untouched until the commit), and
    ``:fetch_at``, the ``attempted_at`` written: the time the limits were counted at.
    """
    locked = (
        select(Job.id, Job.kind, *FETCH_ORDER[:-1])
        .where(
            *due_in_queue(features),
            Job.kind != all_(bindparam("full_kinds", type_=ARRAY(Text))),
        )
        .order_by(*FETCH_ORDER)
        .limit(bindparam("fetch_limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("locked")
    )
    rank = func.row_number().over(
        partition_by=locked.c.kind,
        order_by=(locked.c.priority, locked.c.scheduled_at, locked.c.id),
    )
    ranked = select(locked.c.id, locked.c.kind, rank.label("rank")).cte("ranked")
    caps = (
        func.unnest(
            bindparam("capped_kinds", type_=ARRAY(Text)),
            bindparam("kind_caps", type_=ARRAY(Integer)),
        )
        .table_valued(column("kind", Text), column("cap", Integer))
        .render_derived(name="caps")
    )
    chosen = (
        select(ranked.c.id)
        .select_from(ranked.outerjoin(caps, caps.c.kind == ranked.c.kind))
        .where(or_(caps.c.cap.is_(None), ranked.c.rank <= caps.c.cap))
        .cte("chosen")
    )
    started_at = bindparam("fetch_at", type_=DateTime(timezone=True))
    return (
        update(Job)
        .where(Job.id == chosen.c.id)
        .values(running_values(features, started_at))
        .returning(*fetched_columns(features))
    )


@functools.cache
def _job_builder(features: Features) -> Callable[[Sequence[Any]], Job[Any]]:
    # The plain fetch's builder for the same returned columns (fetched_columns): detached
    # Jobs straight from Core rows, with sequence_key / workflow_id loaded as there.
    return detached_job_builder(fetched_columns(features))


class Allowance:
    """How many jobs a fetch may still take: of the queue, and of each limited kind."""

    def __init__(
        self, limits: QueueLimits, usage: Mapping[str, Any] | RowMapping, free: int
    ) -> None:
        self.total = free
        self.kinds: dict[str, int] = {}
        for i, rule in enumerate(limits.rules):
            if rule.by_key:
                continue  # a cap per key, in the keyed fetch
            allowed = rule.allowance(usage.get(f"running_{i}", 0), usage.get(f"starts_{i}", 0))
            if rule.scope.by == "queue":
                self.total = min(self.total, allowed)
            else:
                self.kinds[rule.scope.name] = allowed

    def params(self) -> dict[str, Any]:
        open_kinds = {kind: left for kind, left in self.kinds.items() if left > 0}
        return {
            "fetch_limit": self.total,
            "full_kinds": [kind for kind, left in self.kinds.items() if left <= 0],
            "capped_kinds": list(open_kinds),
            "kind_caps": list(open_kinds.values()),
        }

    def take(self, jobs: list[Job[Any]]) -> bool:
        """Count ``jobs`` against the allowances; True if a kind's ran out with them (the
        batch may have left rows of it over its cap, in place of other kinds' rows)."""
        self.total -= len(jobs)
        ran_out = False
        for kind, taken in Counter(job.kind for job in jobs).items():
            if kind in self.kinds:
                self.kinds[kind] -= taken
                ran_out = ran_out or self.kinds[kind] <= 0
        return ran_out


def window_of(at: dt.datetime, per: dt.timedelta) -> tuple[dt.datetime, dt.datetime]:
    """The window of a ``per``-long rate period that ``at`` falls in: its start and end."""
    width = max(1, (per // WINDOWS_PER_PERIOD) // _MICROSECOND)
    micros = (at - _EPOCH) // _MICROSECOND
    start = _EPOCH + (micros - micros % width) * _MICROSECOND
    return start, start + width * _MICROSECOND


def record_starts(
    session: Connection | Session, limits: QueueLimits, at: dt.datetime, jobs: list[Job[Any]]
) -> None:
    """Count ``jobs`` in the rate windows of ``limits``' rate-limited scopes, and delete
    the windows no period reaches any more. Runs under the scopes' locks."""
    kinds = Counter(job.kind for job in jobs)
    rows = []
    for rule in limits.rated:
        assert rule.per is not None
        started = len(jobs) if rule.scope.by == "queue" else kinds[rule.scope.name]
        if started:
            start, end = window_of(at, rule.per)
            rows.append(
                {
                    "scope": rule.scope.key,
                    "window_start": start,
                    "window_end": end,
                    "keep_until": end + rule.per,
                    "starts": started,
                }
            )
    if not rows:
        return
    session.execute(count_starts(), rows)
    session.execute(
        delete(RateWindow).where(
            RateWindow.scope.in_([row["scope"] for row in rows]), RateWindow.keep_until < at
        )
    )


@functools.cache
def count_starts() -> Any:
    """Add starts to a window's row. A process with another period for the scope may
    have made the row with another end: the later end and the later keep-until win, so
    every count stays conservative."""
    statement = insert(RateWindow)
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=[RateWindow.scope, RateWindow.window_start],
        set_={
            "starts": RateWindow.starts + excluded.starts,
            "window_end": func.greatest(RateWindow.window_end, excluded.window_end),
            "keep_until": func.greatest(RateWindow.keep_until, excluded.keep_until),
        },
    )


def fetch_limited(
    engine: Engine, limits: QueueLimits, free: int, worker_id: str, *, features: Features
) -> list[Job[Any]]:
    """Fetch up to ``free`` jobs of ``limits.queue``, no more than its limits allow now;
    in the order they should start. See the module's docstring for why it is sound.

    Core all the way, as the plain fetch (:func:`~sa_jobs.worker.producer.fetch_jobs`):
    a connection's transaction and :func:`detached_job_builder`, not a Session and the
    ORM loader, which cost a no-op job about half its worker CPU (issue 28)."""
    build = _job_builder(features)
    # On psycopg 3 the locks and the count go with BEGIN as one query (so a never-binding
    # concurrency limit is BEGIN, fetch, COMMIT, as the plain fetch): the server runs them
    # in order, each statement on a snapshot of its own (READ COMMITTED), so the count
    # still begins after the locks are held (:mod:`.opening`).
    opening = (lock_scopes(limits), limits_usage(limits))
    with opened_transaction(engine, opening) as (connection, (_, counted)):
        usage = counted.mapping()
        at: dt.datetime = usage["at"]
        allowance = Allowance(limits, usage, free)
        fetched: list[Job[Any]] = []
        while allowance.total > 0:
            params = {
                **allowance.params(),
                "fetch_queue": limits.queue,
                "fetch_worker_id": worker_id,
                "fetch_at": at,
            }
            rows = connection.execute(jobs_fetch_limited(features), params).all()
            jobs = [build(row) for row in rows]
            fetched += jobs
            if not allowance.take(jobs):
                break  # no kind was cut short: the queue has nothing more to give
        record_starts(connection, limits, at, fetched)
    return in_start_order(fetched)
