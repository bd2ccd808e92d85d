"""Which jobs a tick fires for a periodic job that is due: on-time instants and catch-up.

Pure schedule arithmetic (no database), so it is tested instant by instant, across DST
changes, without a clock.

An instant is *on time* while less than ``misfire_grace`` has passed since it: the
ticker was merely late (a tick interval, a slow transaction, a quick restart). On-time
instants always get one job each. Older due instants were *missed* — nothing ran while
they came and went — and ``catch_up`` decides:

* ``"skip"``: none of them; the job carries on with its next instant.
* ``"once"``: one job for the lot (for the latest missed instant, with their count).
* ``"all"``: one job per missed instant, but at most :data:`CATCH_UP_LIMIT`, the most
  recent ones; older ones are dropped (and logged).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Literal

import attrs

from sa_jobs.periodic.schedule import Schedule

__all__ = ["CATCH_UP_LIMIT", "COUNT_LIMIT", "CatchUp", "Fire", "Plan", "plan"]

CatchUp = Literal["skip", "once", "all"]
CATCH_UP_MODES: tuple[CatchUp, ...] = ("skip", "once", "all")

#: ``catch_up="all"`` fires at most this many missed instants (the most recent ones), and
#: on-time instants are capped the same way.
CATCH_UP_LIMIT = 1000
#: Missed instants are counted (for the log and the ``"once"`` job's metadata) up to this.
COUNT_LIMIT = 10_000


@attrs.frozen
class Fire:
    """One job to insert: for ``instant``; ``missed`` > 0 for a ``"once"`` catch-up job
    standing for that many missed instants; ``requested`` for a ``run_now`` request."""

    instant: dt.datetime
    missed: int = 0
    requested: bool = False


@attrs.frozen
class Plan:
    """What a tick does for one due periodic job.

    Attributes:
        fires: The jobs to insert, oldest instant first.
        next_run_at: The row's new next fire instant (the first one after ``now``).
        dropped: Missed instants that get no job (counting stops at :data:`COUNT_LIMIT`).
    """

    fires: tuple[Fire, ...]
    next_run_at: dt.datetime
    dropped: int = 0


def plan(
    schedule: Schedule,
    next_run_at: dt.datetime,
    now: dt.datetime,
    *,
    catch_up: CatchUp,
    misfire_grace: dt.timedelta,
    limit: int = CATCH_UP_LIMIT,
) -> Plan:
    """Plan the jobs for a periodic job whose ``next_run_at`` has come (``<= now``).

    ``next_run_at`` is itself an instant to fire (it may be off the cron grid: a
    ``run_on_start`` fire); the instants after it follow ``schedule``.
    """
    following = schedule.after(next_run_at, now)
    cutoff = now - misfire_grace
    on_time: list[Fire] = []
    upcoming: Iterator[dt.datetime]
    if next_run_at > cutoff:
        upcoming = itertools.chain([next_run_at], schedule.walk(next_run_at, next_run_at))
    else:
        upcoming = schedule.walk(next_run_at, cutoff)
    for instant in upcoming:
        if instant > now or len(on_time) >= limit:
            break
        on_time.append(Fire(instant))
    if next_run_at > cutoff:
        return Plan(tuple(on_time), following)

    # Missed: next_run_at itself, and the schedule's instants after it up to the cutoff,
    # walked backwards from the newest (one iterator, at most COUNT_LIMIT steps) so that
    # "all" keeps the most recent ones.
    newest_first: list[dt.datetime] = []
    count = 0
    upper = on_time[0].instant if on_time else following
    for earlier in schedule.walk(next_run_at, upper, reverse=True):
        if earlier <= next_run_at or count >= COUNT_LIMIT:
            break
        if earlier <= cutoff:
            count += 1
            if len(newest_first) < limit:
                newest_first.append(earlier)
    count += 1
    if len(newest_first) < limit:
        newest_first.append(next_run_at)
    if catch_up == "skip":
        return Plan(tuple(on_time), following, dropped=count)
    if catch_up == "once":
        return Plan((Fire(newest_first[0], missed=count), *on_time), following)
    kept = tuple(Fire(missed) for missed in reversed(newest_first))
    return Plan((*kept, *on_time), following, dropped=count - len(kept))
