"""The health guard: judging the xmin horizon and the dead rows of ``sa_job``.

Why these, of all figures: every job leaves dead row versions behind (``available`` →
``running`` → finished, then the cleaner's delete). Vacuum removes them only once no
transaction could still see them — once they are older than the database's *xmin
horizon*. One transaction left open (an ``idle in transaction`` session, a long report,
a forgotten prepared transaction, a replication slot or standby that lags) pins the
horizon, vacuum removes nothing, PostgreSQL cannot even mark the fetch index's entries
dead, and every fetch walks all of them again: measured on a 10M-row table, a fetch took
41 to 72 times its normal time after 100,000 jobs went through the queue behind one open
transaction (``docs/performance.md``, "Dead rows and the xmin horizon"). A slower fetch
grows the backlog, which makes more dead rows: the "death spiral" of River #59,
procrastinate #1454 and PlanetScale's write-up. No peer checks for it;
:func:`check_health` does. The figures are read by :mod:`sa_jobs._inspect.horizon` (which also
says what a role without ``pg_monitor`` can see).

It also judges the mistake that fails silently: a queue with available jobs that no
live worker serves (:func:`sa_jobs._act.queues.unserved_queues`) — a handler's kind that
defaults to a queue its worker was not told to work, a typo in ``-q``, a worker type
that is down. Those jobs wait forever and nothing fails, so the check warns once the
oldest of them has waited ``unserved_age_warning`` (default 60 s: long enough that a
worker starting up or a job inserted a moment ago is no finding).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy import Connection, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sa_jobs._act.queues import LIVE_WORKER_WINDOW, unserved_queues
from sa_jobs._base.sessions import either_session
from sa_jobs._base.sql import seconds_interval
from sa_jobs._declare.option_checks import check_positive_count
from sa_jobs._inspect import horizon
from sa_jobs._inspect.horizon import HOLDERS_LISTED, DeadTuples, HolderKind, HorizonHolder
from sa_jobs._inspect.job_counts import oldest_available
from sa_jobs._table.schema import has_stuck_columns
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "Finding",
    "Health",
    "HealthLevel",
    "HealthThresholds",
    "check_health",
    "dead_tuple_limits",
    "evaluate",
    "read_health",
    "stuck_workers",
]


class HealthLevel(enum.StrEnum):
    """How bad it is; ``sa-jobs health`` exits 0, 3 or 4 for these."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {HealthLevel.OK: 0, HealthLevel.WARNING: 1, HealthLevel.CRITICAL: 2}


def _positive_duration(name: str, value: dt.timedelta) -> None:
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise InvalidOptionsError(name, f"must be a positive timedelta, got {value!r}")


@attrs.frozen
class HealthThresholds:
    """When the health check warns and when it calls it critical; each pair is checked
    when built (positive, warning no higher than critical).

    The defaults come from the measurements in ``docs/performance.md`` (a fetch 41 to 72 times
    slower after 100,000 jobs — about 200,000 dead row versions, two transactions per
    job — behind one open transaction) and the advice in ``docs/operations.md``.

    Attributes:
        xmin_age_warning: A transaction (or prepared transaction) has held the horizon
            this long. Default 5 minutes: a queue working 500 jobs a second has made
            150,000 jobs' dead rows unremovable by then.
        xmin_age_critical: Default 30 minutes.
        xmin_xids_warning: The horizon is this many transaction ids behind the current
            one — the only measure a replication slot has (it has no start time).
            Default 200,000 (about the 100,000 jobs of the measurement).
        xmin_xids_critical: Default 1,000,000.
        dead_tuples_warning: Dead row versions in ``sa_job`` (``n_dead_tup``). The
            schema has autovacuum start at 1 % of the table's rows, so past this many
            vacuum is behind or held back. Default 200,000. On a big table autovacuum
            itself waits longer (50 + 1 % of 50M live rows is 500,050 dead), so the
            level is judged against the larger of this and ``TRIGGER_WARNING`` times the
            table's autovacuum trigger (see :func:`dead_tuple_limits`).
        dead_tuples_critical: Default 1,000,000; likewise against ``TRIGGER_CRITICAL``
            times the trigger.
        unserved_age_warning: A queue that no live worker serves (and that is not
            paused) has had an available job waiting this long. Default 60 s: a job
            inserted a moment ago, or a worker still starting, is no finding. A warning
            only: nothing is lost, but nothing happens either.
    """

    xmin_age_warning: dt.timedelta = dt.timedelta(minutes=5)
    xmin_age_critical: dt.timedelta = dt.timedelta(minutes=30)
    xmin_xids_warning: int = 200_000
    xmin_xids_critical: int = 1_000_000
    dead_tuples_warning: int = 200_000
    dead_tuples_critical: int = 1_000_000
    unserved_age_warning: dt.timedelta = dt.timedelta(seconds=60)

    def __attrs_post_init__(self) -> None:
        _positive_duration("xmin_age_warning", self.xmin_age_warning)
        _positive_duration("unserved_age_warning", self.unserved_age_warning)
        _positive_duration("xmin_age_critical", self.xmin_age_critical)
        for name in ("xmin_xids", "dead_tuples"):
            check_positive_count(f"{name}_warning", getattr(self, f"{name}_warning"))
            check_positive_count(f"{name}_critical", getattr(self, f"{name}_critical"))
        for name in ("xmin_age", "xmin_xids", "dead_tuples"):
            warning, critical = getattr(self, f"{name}_warning"), getattr(self, f"{name}_critical")
            if warning > critical:
                raise InvalidOptionsError(
                    f"{name}_warning",
                    f"{warning} is above {name}_critical ({critical}); a warning comes first",
                )


#: Dead rows are a warning only past this many times autovacuum's trigger for the table
#: (and past ``dead_tuples_warning``): under it, autovacuum has simply not come round yet.
TRIGGER_WARNING = 2
#: And critical only past this many times the trigger (and ``dead_tuples_critical``).
TRIGGER_CRITICAL = 5


def dead_tuple_limits(dead: DeadTuples, thresholds: HealthThresholds) -> tuple[int, int]:
    """The warning and critical dead-row counts for ``sa_job`` as it is now.

    The configured thresholds, raised to ``TRIGGER_WARNING`` / ``TRIGGER_CRITICAL`` times
    the table's autovacuum trigger (``autovacuum_vacuum_threshold +
    autovacuum_vacuum_scale_factor * live``): a table of 50M live rows gets no vacuum
    before 500,050 dead rows, so 200,000 dead is no sign of trouble there. With
    autovacuum off for the table, the configured thresholds stand.
    """
    warning, critical = thresholds.dead_tuples_warning, thresholds.dead_tuples_critical
    if dead.vacuum_trigger is None:
        return warning, critical
    return (
        max(warning, TRIGGER_WARNING * dead.vacuum_trigger),
        max(critical, TRIGGER_CRITICAL * dead.vacuum_trigger),
    )


@attrs.frozen
class Finding:
    """One threshold crossed: which figure, how bad, and what it means."""

    level: HealthLevel
    figure: str
    message: str


@attrs.frozen
class Health:
    """The health figures and their verdict.

    Attributes:
        level: The worst of the findings (``ok`` when there are none).
        findings: Each threshold crossed, with what to do about it.
        holders: What holds the horizon back, the oldest first (at most 10).
        oldest_xid_age: Transaction ids since the oldest transaction still running that
            has written anything, in any database of the server — visible to every role.
        dead_tuples: ``sa_job``'s dead and live rows and its vacuums; None when the
            statistics have no entry for it (track_counts off).
        sees_all_sessions: The role can see every session's transaction
            (``pg_read_all_stats``, in ``pg_monitor``, or superuser). Without it only the
            role's own sessions are listed, and ``oldest_xid_age`` stands in for the rest.
        thresholds: What the figures were judged by.
        xmin_xid_age: The horizon's age in transaction ids: its oldest holder of job
            rows (0 when nothing holds it).
        xmin_age: How long the oldest open transaction (or prepared one) holding the
            horizon has been open; None when none does.
        unserved_queues: Each queue with available jobs that no live worker serves
            (heartbeat within the rescuer's default 60 s) and that is not paused, with
            how long its oldest available job has waited; judged against
            ``unserved_age_warning``. None when the role may not read ``sa_job`` and
            ``sa_job_worker`` (that part of the check is then skipped).
        stuck_workers: Each live worker whose handler threads stuck past their grace
            period reached its ``stuck_thread_limit``, by id: ``(stuck threads, the
            limit)``. Its slots stay taken until it restarts.
    """

    level: HealthLevel
    findings: tuple[Finding, ...]
    holders: tuple[HorizonHolder, ...]
    oldest_xid_age: int
    dead_tuples: DeadTuples | None
    sees_all_sessions: bool
    thresholds: HealthThresholds
    xmin_xid_age: int
    xmin_age: dt.timedelta | None
    unserved_queues: Mapping[str, dt.timedelta] | None = attrs.field(factory=dict)
    stuck_workers: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)


# ---------------------------------------------------------------------- reading
def read_health(
    connection: Connection,
    thresholds: HealthThresholds | None = None,
    *,
    available: Mapping[str, dt.timedelta] | None = None,
) -> Health:
    """Read the health figures on ``connection`` and judge them (see :func:`check_health`).

    ``available`` is :func:`~sa_jobs._inspect.job_counts.oldest_available`'s answer when the
    caller has read it already (``stats()``); otherwise it is read here.
    """
    thresholds = thresholds or HealthThresholds()
    holders = horizon.horizon_holders(connection)
    sees_all = horizon.sees_all_sessions(connection)
    oldest = horizon.oldest_xid_age(connection)
    dead = horizon.dead_tuples(connection)
    unserved = _unserved(connection, available)
    stuck = stuck_workers(connection) if unserved is not None else {}
    level, findings = evaluate(
        holders,
        dead,
        thresholds,
        oldest_xid_age=None if sees_all else oldest,
        unserved=unserved or {},
        stuck=stuck,
    )
    return Health(
        level=level,
        findings=findings,
        holders=tuple(holders[:HOLDERS_LISTED]),
        oldest_xid_age=oldest,
        dead_tuples=dead,
        sees_all_sessions=sees_all,
        thresholds=thresholds,
        xmin_xid_age=max((h.xid_age for h in holders if h.holds_job_rows), default=0),
        xmin_age=max(
            (h.age for h in holders if h.holds_job_rows and h.age is not None), default=None
        ),
        unserved_queues=unserved,
        stuck_workers=stuck,
    )


#: ``insufficient_privilege``: the role may not read the job or worker tables.
_NO_PRIVILEGE = "42501"


def _unserved(
    connection: Connection, available: Mapping[str, dt.timedelta] | None
) -> dict[str, dt.timedelta] | None:
    """The unserved queues; None when the role may not read the tables that tell (the
    rest of the health check needs only PostgreSQL's views, and works for any role)."""
    if available is not None:
        return unserved_queues(connection, available)
    try:
        with connection.begin_nested():  # a refusal must not abort the caller's transaction
            return unserved_queues(connection, oldest_available(connection))
    except DBAPIError as exc:
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        if code != _NO_PRIVILEGE:
            raise
        return None


def stuck_workers(
    connection: Connection, live_within: dt.timedelta = LIVE_WORKER_WINDOW
) -> dict[str, tuple[int, int]]:
    """Live workers (heartbeat within ``live_within``) whose stuck handler threads
    reached their ``stuck_thread_limit``: ``{id: (stuck, limit)}``. Empty on a database
    not at revision ``sajobs_core_0006`` (its heartbeats do not say)."""
    if not has_stuck_columns(connection):
        return {}
    w = WorkerProcess
    rows = connection.execute(
        select(w.id, w.stuck_threads, w.stuck_thread_limit)
        .where(
            w.heartbeat_at > func.now() - seconds_interval(live_within.total_seconds()),
            w.stuck_threads > 0,
            w.stuck_threads >= w.stuck_thread_limit,
        )
        .order_by(w.id)
    )
    # The WHERE clause leaves no row without a limit (NULL compares false).
    return {worker: (stuck, limit or 0) for worker, stuck, limit in rows}


@either_session
def check_health(session: Session, thresholds: HealthThresholds | None = None) -> Health:
    """The health of the queue's database: what holds the xmin horizon back, how many
    dead rows ``sa_job`` carries, and which queues have available jobs that no live worker
    serves, judged by ``thresholds`` (defaults: :class:`HealthThresholds`). Reads only; a
    few catalog queries and one descent of the fetch index per queue, fast on any table.

    Works for any role; see the module for what needs ``pg_monitor``. A role that may
    not read ``sa_job`` and ``sa_job_worker`` gets no unserved-queue figures (None).
    """
    return read_health(session.connection(), thresholds)


# ---------------------------------------------------------------------- judging


def _level(value: float, warning: float, critical: float) -> HealthLevel:
    if value >= critical:
        return HealthLevel.CRITICAL
    if value >= warning:
        return HealthLevel.WARNING
    return HealthLevel.OK


def _minutes(value: dt.timedelta) -> str:
    seconds = value.total_seconds()
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


_WHY = "vacuum can remove no dead job row younger than it, and every fetch walks them again"


def evaluate(
    holders: Sequence[HorizonHolder],
    dead: DeadTuples | None,
    thresholds: HealthThresholds,
    *,
    oldest_xid_age: int | None = None,
    unserved: Mapping[str, dt.timedelta] | None = None,
    stuck: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[HealthLevel, tuple[Finding, ...]]:
    """Judge the figures: one finding per threshold crossed, the worst level first.

    ``oldest_xid_age`` (given when the role cannot see other roles' sessions) is judged
    like a holder's age in transaction ids. ``unserved`` maps each queue that no live
    worker serves to how long its oldest available job has waited; ``stuck`` each
    worker whose stuck handler threads reached its limit to ``(stuck, limit)``.
    """
    t = thresholds
    findings: list[Finding] = []
    for holder in holders:
        if not holder.holds_job_rows:
            continue
        what = f"{holder.kind.value} {holder.name}" + (
            f" ({holder.detail})" if holder.detail else ""
        )
        if holder.age is not None:
            level = _level(
                holder.age.total_seconds(),
                t.xmin_age_warning.total_seconds(),
                t.xmin_age_critical.total_seconds(),
            )
            if level is not HealthLevel.OK:
                age_limit = (
                    t.xmin_age_critical if level is HealthLevel.CRITICAL else t.xmin_age_warning
                )
                findings.append(
                    Finding(
                        level,
                        "xmin_age",
                        f"{what} has held the xmin horizon for {_minutes(holder.age)} "
                        f"({level.value} at {_minutes(age_limit)}): {_WHY}; {_remedy(holder)}",
                    )
                )
                continue
        level = _level(holder.xid_age, t.xmin_xids_warning, t.xmin_xids_critical)
        if level is not HealthLevel.OK:
            findings.append(
                Finding(
                    level,
                    "xmin_xids",
                    f"{what} holds the xmin horizon {holder.xid_age:,} transactions back "
                    f"({level.value} at {_xid_limit(level, t):,}): {_WHY}; {_remedy(holder)}",
                )
            )
    if oldest_xid_age is not None:
        level = _level(oldest_xid_age, t.xmin_xids_warning, t.xmin_xids_critical)
        if level is not HealthLevel.OK:
            findings.append(
                Finding(
                    level,
                    "xmin_xids",
                    f"a transaction started {oldest_xid_age:,} transactions ago is still "
                    f"running ({level.value} at {_xid_limit(level, t):,}); this role cannot "
                    "see other roles' sessions (grant it pg_monitor to see which)",
                )
            )
    if dead is not None:
        dead_warning, dead_critical = dead_tuple_limits(dead, t)
        level = _level(dead.dead, dead_warning, dead_critical)
        if level is not HealthLevel.OK:
            critical = level is HealthLevel.CRITICAL
            limit = dead_critical if critical else dead_warning
            vacuumed = max(
                (v for v in (dead.last_vacuum, dead.last_autovacuum) if v is not None),
                default=None,
            )
            findings.append(
                Finding(
                    level,
                    "dead_tuples",
                    f"sa_job has {dead.dead:,} dead row versions beside {dead.live:,} live ones "
                    f"({level.value} at {limit:,}{_trigger_note(dead)}); last vacuumed "
                    f"{vacuumed.isoformat(timespec='seconds') if vacuumed else 'never'}: "
                    "check that autovacuum runs and that nothing holds the xmin horizon",
                )
            )
    for queue, waited in (unserved or {}).items():
        if waited >= t.unserved_age_warning:
            findings.append(
                Finding(
                    HealthLevel.WARNING,
                    "unserved_queue",
                    f"queue {queue!r} has had an available job waiting for {_minutes(waited)} "
                    f"and no live worker serves it (warning at {_minutes(t.unserved_age_warning)})"
                    f": its jobs wait until one does; start a worker for it (sa-jobs work "
                    f"MODULE:WORKER -q {queue}=N, or Worker(engine, queues={{{queue!r}: N}})) "
                    "or pause it",
                )
            )
    for worker, (count, limit) in (stuck or {}).items():
        findings.append(
            Finding(
                HealthLevel.WARNING,
                "stuck_threads",
                f"worker {worker} has {count} handler threads stuck past their timeout "
                f"(its stuck_thread_limit is {limit}): each further stuck run keeps its slot "
                "for good and the worker fetches less; restart it (sa-jobs work "
                "--replace-stuck does) and fix the handler that ignores its timeout",
            )
        )
    findings.sort(key=lambda finding: finding.level.rank, reverse=True)
    worst = findings[0].level if findings else HealthLevel.OK
    return worst, tuple(findings)


def _trigger_note(dead: DeadTuples) -> str:
    if dead.vacuum_trigger is None:
        return ", autovacuum is off for it"
    return f"; autovacuum starts at {dead.vacuum_trigger:,}"


def _xid_limit(level: HealthLevel, t: HealthThresholds) -> int:
    return t.xmin_xids_critical if level is HealthLevel.CRITICAL else t.xmin_xids_warning


def _remedy(holder: HorizonHolder) -> str:
    if holder.kind is HolderKind.PREPARED:
        return f"COMMIT PREPARED or ROLLBACK PREPARED {holder.name!r}"
    if holder.kind is HolderKind.SLOT:
        return f"catch its consumer up, or drop the slot: pg_drop_replication_slot({holder.name!r})"
    pid = holder.name.removeprefix("pid ")
    return f"end it (pg_terminate_backend({pid})) and set idle_in_transaction_session_timeout"
