"""The partition keys of a queue, as ``stats()``, the Prometheus gauges and the dashboard
show them: how many keys have available jobs, the keys with the most, and how long each
of those has waited.

For a queue whose available jobs have partition keys (a fair or key-limited queue; the
``sa_jobs_fairness`` branch). The cost is bounded whatever the number of keys or jobs:

* **Counts** come from an index-only scan of ``sa_job_partition_idx`` that stops after
  ``exact_limit`` rows (the limit ``stats()`` counts states with): below it every key's
  count is exact; past it they are estimated from a page sample of the table
  (``TABLESAMPLE SYSTEM``, as :mod:`sa_jobs._inspect.job_counts` estimates states), scaled to the
  queue's available jobs, and :attr:`QueueKeys.estimated` says so.
* **The oldest wait** is read for the listed keys only: one descent of the index per key
  and priority (the index orders a key's jobs by priority, then scheduled time).

Nothing is written.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import attrs
from sqlalchemy import (
    REAL,
    Connection,
    Integer,
    Text,
    bindparam,
    func,
    literal,
    select,
    tablesample,
)
from sqlalchemy import cast as sql_cast

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table, state_is

__all__ = ["KEYS_LISTED", "KeyFigures", "QueueKeys", "queue_keys"]

#: How many keys are listed per queue (the ones with the most available jobs).
KEYS_LISTED = 10
#: Pages the estimate samples.
SAMPLE_PAGES = 2000

_jobs = job_table.c


@attrs.frozen
class KeyFigures:
    """One partition key of a queue.

    Attributes:
        key: The key's text (``sa_job.partition_key``).
        available: Its ``available`` jobs (an estimate when the queue's are).
        oldest_available_age: How long its longest-waiting available job has been due.
    """

    key: str
    available: int
    oldest_available_age: dt.timedelta | None


@attrs.frozen
class QueueKeys:
    """The keys of one queue's available jobs.

    Attributes:
        keys: How many distinct keys have available jobs (estimated when ``estimated``).
        top: The keys with the most available jobs, most first (at most ten).
        estimated: The counts come from a sample (past the exact limit).
    """

    keys: int
    top: tuple[KeyFigures, ...]
    estimated: bool = False


def _keyed_available(queue: str) -> list[Any]:
    return [
        state_is(_jobs.state, JobState.AVAILABLE),
        _jobs.queue == bindparam("queue_name", queue, Text),
        _jobs.partition_key.is_not(None),
    ]


def _counts(connection: Connection, queue: str, limit: int) -> Counter[str] | None:
    """Every key's available jobs, or None when the queue has more than ``limit``."""
    rows = select(_jobs.partition_key).where(*_keyed_available(queue)).limit(limit + 1).subquery()
    found = Counter(
        {
            key: n
            for key, n in connection.execute(
                select(rows.c.partition_key, func.count()).group_by(rows.c.partition_key)
            )
        }
    )
    return found if sum(found.values()) <= limit else None


def _sampled(connection: Connection, queue: str, limit: int) -> Counter[str]:
    """Estimated available jobs per key, from about :data:`SAMPLE_PAGES` pages."""
    pages = connection.scalar(
        select(
            func.pg_relation_size(func.to_regclass(job_table.name))
            / sql_cast(func.current_setting("block_size"), Integer)
        )
    )
    percent = min(100.0, 100.0 * SAMPLE_PAGES / max(int(pages or 0), 1))
    sample = tablesample(job_table, func.system(sql_cast(percent, REAL)), name="sampled")
    rows = connection.execute(
        select(sample.c.partition_key, func.count())
        .where(
            state_is(sample.c.state, JobState.AVAILABLE),
            sample.c.queue == queue,
            sample.c.partition_key.is_not(None),
        )
        .group_by(sample.c.partition_key)
    )
    found = Counter({key: max(1, round(n * 100.0 / percent)) for key, n in rows})
    total = sum(found.values())
    if total and total <= limit:
        # More than the limit were counted: the sample's split of at least that many.
        scale = (limit + 1) / total
        found = Counter({key: max(1, round(n * scale)) for key, n in found.items()})
    return found


def _oldest(connection: Connection, queue: str, key: str) -> dt.timedelta | None:
    """How long the key's oldest due available job has waited: one index descent per
    priority (1 to 4), each the first scheduled time at that priority."""
    priorities = select(func.generate_series(1, 4).label("p")).subquery("priorities")
    first = (
        select(_jobs.scheduled_at)
        .where(
            *_keyed_available(queue),
            _jobs.partition_key == bindparam("key", key, Text),
            _jobs.priority == priorities.c.p,
        )
        .order_by(_jobs.scheduled_at)
        .limit(1)
        .lateral("first")
    )
    earliest: dt.datetime | None = connection.scalar(
        select(func.min(first.c.scheduled_at)).select_from(priorities.join(first, literal(True)))
    )
    if earliest is None:
        return None
    now: dt.datetime = connection.scalar(select(func.now()))  # type: ignore[assignment]
    waited: dt.timedelta = now - earliest
    return max(dt.timedelta(0), waited)


def queue_keys(connection: Connection, queue: str, exact_limit: int) -> QueueKeys | None:
    """The keys of ``queue``'s available jobs; None when none has a key."""
    counts = _counts(connection, queue, exact_limit)
    estimated = counts is None
    if counts is None:
        counts = _sampled(connection, queue, exact_limit)
    if not counts:
        return None
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:KEYS_LISTED]
    return QueueKeys(
        keys=len(counts),
        top=tuple(
            KeyFigures(key=key, available=n, oldest_available_age=_oldest(connection, queue, key))
            for key, n in top
        ),
        estimated=estimated,
    )
