"""What limits cost a worker draining a queue: the plain drain against two limited ones.

Real worker processes (:func:`sa_jobs.benchmark.noop.worker_process`), each serving the
run's first queue and a second, empty one (:data:`OTHER`), drain the same jobs three
ways, taking turns round after round (the machine drifts; a block per variant would
measure the drift):

* ``none`` — no limit anywhere: the baseline;
* ``other`` — a ``ConcurrencyLimit(1)`` on the *other* queue: the drained queue has no
  limit and must cost what it costs with none configured (issue 28);
* ``nonbinding`` — a ``ConcurrencyLimit`` on the drained queue, higher than its slots,
  so it never holds a job back: the limited fetch's own cost (lock, count, fetch,
  commit), aimed at no more than 1.10 times the baseline.

The medians of the rounds are reported as jobs/s, and the two ratios to the baseline.
"""

from __future__ import annotations

import datetime as dt
import functools
import statistics
from collections.abc import Callable

from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.benchmark import noop
from sa_jobs.benchmark.report import Figure

__all__ = ["OTHER", "ROUNDS", "figures"]

#: The second queue every variant's workers serve; only ``other`` limits it.
OTHER = "sa_jobs_bench_other"
ROUNDS = 3
#: Below this many jobs a drain is too short to compare: one round (a smoke run).
FEW_JOBS = 1_000
#: Jobs each drain works (fewer if the run enqueues fewer).
MOST_JOBS = 10_000

VARIANTS = ("none", "other", "nonbinding")


def figures(
    url: URL,
    engine: Engine,
    queues: dict[str, int],
    jobs: int,
    *,
    fill: Callable[[int, str], None],
    drain: Callable[[Callable[..., None], dict[str, int], int], tuple[float, float]],
    say: Callable[[str], None],
) -> list[Figure]:
    """Drain ``jobs`` (at most :data:`MOST_JOBS`) of the first queue of ``queues`` once
    per variant per round. ``fill(jobs, queue)`` enqueues them into an empty table;
    ``drain(target, queues, jobs)`` runs the worker processes and returns their rate."""
    queue, slots = next(iter(queues.items()))
    jobs = min(jobs, MOST_JOBS)
    served = {queue: slots, OTHER: slots}
    rounds = ROUNDS if jobs >= FEW_JOBS else 1
    say(f"limits: {jobs:,} jobs drained with none / another / a loose limit, {rounds} round(s)")
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            fill(jobs, queue)
            _name_other_queue(engine)
            target = functools.partial(noop.worker_process, limits=_limits_spec(name, queue))
            rates[name].append(drain(target, served, jobs)[0])
    median = {name: statistics.median(values) for name, values in rates.items()}
    return [
        Figure(
            "worked_limits_none",
            f"worked, queue {queue!r}, no limit anywhere",
            "jobs/s",
            median["none"],
        ),
        Figure(
            "worked_limits_other",
            f"worked, queue {queue!r}, a limit on another queue",
            "jobs/s",
            median["other"],
        ),
        Figure(
            "worked_limits_nonbinding",
            f"worked, queue {queue!r}, a limit on it that never binds",
            "jobs/s",
            median["nonbinding"],
        ),
        Figure(
            "worked_limits_other_ratio",
            "no limit anywhere / a limit on another queue (aim: 1.00)",
            "x",
            median["none"] / median["other"],
            higher_is_better=False,
        ),
        Figure(
            "worked_limits_nonbinding_ratio",
            "no limit anywhere / a never-binding limit (aim: <= 1.10)",
            "x",
            median["none"] / median["nonbinding"],
            higher_is_better=False,
        ),
    ]


def _name_other_queue(engine: Engine) -> None:
    """One job in :data:`OTHER`, due in a year: the queue is then known (a worker serving
    a queue nothing names warns of a typo), and it stays empty for the drain."""
    with Session(engine) as session, session.begin():
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=365)
        sa_jobs.insert(session, noop.BenchNoop(-1), queue=OTHER, scheduled_at=later)


def _limits_spec(variant: str, queue: str) -> tuple[tuple[str, int], ...]:
    """What the worker process limits, as picklable (queue, max_running) pairs: the
    process is spawned, and builds its :class:`~sa_jobs.ConcurrencyLimit` itself."""
    if variant == "other":
        return ((OTHER, 1),)
    if variant == "nonbinding":
        return ((queue, 10**9),)
    return ()
