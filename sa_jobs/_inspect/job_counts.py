"""Jobs per queue and state, counted exactly while that is cheap and estimated past it;
and how long each queue's oldest available job has waited. Shared by
:func:`sa_jobs.stats` and the Prometheus queue gauges, so both are fast on a table of
10 million rows *and* during a backlog of millions.

Any state can hold millions of rows: the finished ones on a table that keeps a week of
history, ``available`` exactly when a queue has fallen behind — which is when someone
looks. So every state is counted the same way:

1. **A capped count** per state: ``count(*)`` over a subquery that stops one row past
   ``exact_limit`` (``LIMIT exact_limit + 1``), each through the partial index holding
   that state's rows (``sa_job_fetch_idx``, ``sa_job_due_idx``, ``sa_job_running_idx``,
   ``sa_job_sequence_pending_idx``, ``sa_job_finalized_idx``). No plan visits more than
   ``exact_limit + 1`` index entries.
2. At or under the limit, **exact**: the state's rows grouped by queue.
3. Past it, **an estimate** from a page sample of the table (``TABLESAMPLE SYSTEM``,
   about ``SAMPLE_PAGES`` pages — one sample for every state past its limit), scaled by
   the sampled fraction of the table's current size (``pg_relation_size``), and never
   below the ``exact_limit + 1`` rows the capped count saw. No ``ANALYZE`` and no planner
   statistics are needed, so it is right on a server whose autovacuum is off; the
   planner's estimate would be as old as the last ``ANALYZE``, which a backlog that grew
   in the last minutes has not had.

A page sample has a few per cent of error when the state is spread over the table (the
finished history; a backlog of millions). A backlog written in one burst sits in
consecutive pages, and a small one (a little past ``exact_limit`` on a table of
millions) meets few sampled pages: its estimate can be off by half — still flagged, and
never below ``exact_limit + 1``. A queue the sample missed is split as ``"?"`` (when it
met none of the state's rows) or left out; ``available`` queues are known from the
index (see below) and each is reported with at least one job.

**Oldest available**: for each queue holding available jobs (found by a skip scan of
the fetch index, one descent per queue), the smallest ``scheduled_at`` of each priority
(the index's order: ``queue, priority, scheduled_at``), one descent each — never a scan
of the backlog.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

import attrs
from sqlalchemy import (
    Connection,
    Integer,
    Select,
    Text,
    and_,
    func,
    literal,
    select,
    tablesample,
    true,
    union_all,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import REAL
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._declare.option_checks import PRIORITY_RANGE, check_positive_count
from sa_jobs._table.models import job_table, state_is
from sa_jobs._table.schema import Features

__all__ = [
    "EXACT_LIMIT",
    "SAMPLE_PAGES",
    "StateCounts",
    "check_exact_limit",
    "count_jobs",
    "oldest_available",
    "pending_steps",
]

#: Jobs of one state counted exactly up to this many; estimated past it.
EXACT_LIMIT = 100_000
#: About how many of the table's pages an estimate reads (8 kB each: ~16 MB).
SAMPLE_PAGES = 2_000

_jobs = job_table.c


@attrs.frozen
class StateCounts:
    """What :func:`count_jobs` found.

    Attributes:
        counts: Per queue, the jobs in each state counted (a state with none left out).
        estimated: The states whose figures are estimates (past ``exact_limit``).
    """

    counts: Mapping[str, Mapping[JobState, int]]
    estimated: frozenset[JobState]


def check_exact_limit(exact_limit: object) -> int:
    """``exact_limit`` as given, or :class:`~sa_jobs.errors.InvalidOptionsError`."""
    return check_positive_count("exact_limit", exact_limit)


def _in_state(state: JobState) -> list[ColumnElement[bool]]:
    """The conditions that pick ``state``'s rows through its own partial index."""
    where = [state_is(_jobs.state, state)]
    if state in FINAL_STATES:
        where.append(_jobs.finalized_at.is_not(None))  # sa_job_finalized_idx
    elif state is JobState.PENDING:
        where.append(_jobs.sequence_key.is_not(None))  # sa_job_sequence_pending_idx
    return where


def _capped(state: JobState, limit: int) -> Select[str, int]:
    # Without an order, so no plan sorts or visits more than limit + 1 rows.
    rows = select(literal(1)).where(*_in_state(state)).limit(limit + 1).subquery()
    return select(literal(state.value, Text).label("state"), func.count().label("n")).select_from(
        rows
    )


def _by_queue(state: JobState) -> Select[str, str, int]:
    return (
        select(_jobs.queue, literal(state.value, Text).label("state"), func.count().label("n"))
        .where(*_in_state(state))
        .group_by(_jobs.queue)
    )


def _sampled(
    connection: Connection, states: Sequence[JobState]
) -> dict[JobState, dict[str, float]]:
    """Estimated jobs per state and queue, from a sample of about SAMPLE_PAGES pages."""
    pages = connection.scalar(
        select(
            func.pg_relation_size(func.to_regclass(job_table.name))
            / sql_cast(func.current_setting("block_size"), Integer)
        )
    )
    percent = min(100.0, 100.0 * SAMPLE_PAGES / max(int(pages or 0), 1))
    sample = tablesample(job_table, func.system(sql_cast(percent, REAL)), name="sampled")
    rows = connection.execute(
        select(sample.c.queue, sample.c.state, func.count())
        .where(state_is(sample.c.state, *states))
        .group_by(sample.c.queue, sample.c.state)
    )
    found: dict[JobState, dict[str, float]] = {state: {} for state in states}
    for queue, state, n in rows:
        found[JobState(state)][queue] = n * 100.0 / percent
    return found


def _estimate(
    shares: Mapping[str, float], limit: int, known_queues: Iterable[str]
) -> dict[str, int]:
    """A state's estimate per queue: the sample's split of a total of at least
    ``limit + 1``; queues known to hold the state get at least 1."""
    shares = dict(shares)
    for queue in known_queues:
        shares.setdefault(queue, 0.0)
    weight = sum(shares.values())
    if weight <= 0:
        # The sample met none: the capped count's floor, split over the known queues
        # (or on "?", which names no queue).
        queues = list(shares) or ["?"]
        return {queue: max(1, (limit + 1) // len(queues)) for queue in queues}
    total = max(limit + 1, round(weight))
    return {queue: max(1, round(total * share / weight)) for queue, share in shares.items()}


def count_jobs(
    connection: Connection,
    states: Iterable[JobState],
    exact_limit: int = EXACT_LIMIT,
    *,
    features: Features | None = None,
    available_queues: Iterable[str] = (),
) -> StateCounts:
    """Jobs of each of ``states`` per queue: exact up to ``exact_limit`` per state,
    estimated past it (see the module). ``pending`` is counted only with the sequence
    branch (only sequences make pending jobs). ``available_queues`` — the queues known to
    hold available jobs (from :func:`oldest_available`) — keeps a queue the sample
    missed from showing none."""
    features = features or Features.of(connection)
    wanted = [s for s in states if s is not JobState.PENDING or features.sequence]
    if not wanted:
        return StateCounts(counts={}, estimated=frozenset())
    capped: dict[str, int] = dict(
        connection.execute(union_all(*(_capped(s, exact_limit) for s in wanted))).all()
    )
    exact = [s for s in wanted if capped[s.value] <= exact_limit]
    over = [s for s in wanted if capped[s.value] > exact_limit]
    counts: dict[str, dict[JobState, int]] = {}
    if exact:
        for queue, state, n in connection.execute(union_all(*(_by_queue(s) for s in exact))):
            counts.setdefault(queue, {})[JobState(state)] = n
    if over:
        sampled = _sampled(connection, over)
        for state in over:
            known = available_queues if state is JobState.AVAILABLE else ()
            for queue, n in _estimate(sampled[state], exact_limit, known).items():
                counts.setdefault(queue, {})[state] = n
    return StateCounts(counts=counts, estimated=frozenset(over))


def oldest_available(connection: Connection) -> dict[str, dt.timedelta]:
    """Per queue holding available jobs, how long the oldest has been due (0 for one
    due in the future's clock skew).

    A skip scan of ``sa_job_fetch_idx``: a recursive query finds each queue with one
    index descent past the one before, and per queue the smallest ``scheduled_at`` of
    each priority is one more descent each, so the cost grows with the number of queues,
    not with the backlog.
    """
    available = state_is(_jobs.state, JobState.AVAILABLE)
    first = (
        select(_jobs.queue.label("queue"))
        .where(available)
        .order_by(_jobs.queue)
        .limit(1)
        .cte("available_queues", recursive=True)
    )
    later = job_table.alias("later")
    following = (
        select(later.c.queue)
        .where(state_is(later.c.state, JobState.AVAILABLE), later.c.queue > first.c.queue)
        .order_by(later.c.queue)
        .limit(1)
        .scalar_subquery()
    )
    queues = first.union_all(select(following).where(first.c.queue.is_not(None)))
    per_priority = [
        select(func.min(_jobs.scheduled_at))
        .where(available, _jobs.queue == queues.c.queue, _jobs.priority == priority)
        .scalar_subquery()
        for priority in PRIORITY_RANGE
    ]
    rows = connection.execute(
        select(queues.c.queue, func.now() - func.least(*per_priority)).where(
            queues.c.queue.is_not(None)
        )
    )
    # Clamped in Python: a job due a moment from now by another clock is due now.
    return {queue: max(age, dt.timedelta(0)) for queue, age in rows if age is not None}


def pending_steps(connection: Connection, exact_limit: int = EXACT_LIMIT) -> dict[str, int]:
    """Per queue, the workflow steps waiting (``pending``) for their dependencies, each
    queue counted up to ``exact_limit + 1`` (past ``exact_limit`` the figure is a floor).

    Through ``sa_job_workflow_pending_idx`` (``sajobs_workflow_0002``), which holds only
    those steps: a skip scan finds each queue (one descent per queue), then a capped
    count per queue. Finished steps, plain jobs and sequences' pending jobs are never
    read. Needs the ``sa_jobs_workflow`` branch.
    """
    waiting = and_(state_is(_jobs.state, JobState.PENDING), _jobs.workflow_id.is_not(None))
    first = (
        select(_jobs.queue.label("queue"))
        .where(waiting)
        .order_by(_jobs.queue)
        .limit(1)
        .cte("step_queues", recursive=True)
    )
    later = job_table.alias("later")
    following = (
        select(later.c.queue)
        .where(
            state_is(later.c.state, JobState.PENDING),
            later.c.workflow_id.is_not(None),
            later.c.queue > first.c.queue,
        )
        .order_by(later.c.queue)
        .limit(1)
        .scalar_subquery()
    )
    queues = first.union_all(select(following).where(first.c.queue.is_not(None)))
    capped = (
        select(literal(1).label("one"))
        .where(waiting, _jobs.queue == queues.c.queue)
        .limit(exact_limit + 1)
        .lateral("capped")
    )
    rows = connection.execute(
        select(queues.c.queue, func.count(capped.c.one))
        .select_from(queues.join(capped, true()))
        .where(queues.c.queue.is_not(None))
        .group_by(queues.c.queue)
    )
    return {queue: int(n) for queue, n in rows}
