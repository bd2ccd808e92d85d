"""``--floor-threads N``: sa_jobs' best worked rate in one process against the workplace's
floor, and what each costs the database at the same fetch size.

The workplace's floor (``/work/shared/bench/floor.py``, the script issue 15 started
from) drains with 4 threads in one process, each fetching 100 jobs a statement and
completing them in one ``UPDATE``: faster than the default floor, which holds no more
jobs at once than the worker's slots. Here it runs the floor's own statements
(:mod:`sa_jobs.benchmark.floor`) on ``N`` threads against the same ``sa_job`` table, and
sa_jobs drains the same jobs in one process at each of :data:`SLOTS` slots per queue;
the best of those rates is the figure the issue's aim compares (``worked_best``).

The database's cost per job is compared at the same fetch size: sa_jobs at
:data:`SAME_BATCH_SLOTS` slots, where its producer fetches ``FETCH_BATCH_MAX`` = 100
jobs a statement once as many slots are free, against the floor's fetches of 100.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from sqlalchemy import URL, Engine

from sa_jobs.benchmark import children, dbcost, floor, noop
from sa_jobs.benchmark.report import Figure
from sa_jobs.worker.producer import FETCH_BATCH_MAX

__all__ = ["SAME_BATCH_SLOTS", "SLOTS", "figures"]

#: Slots per queue sa_jobs is drained with; the best rate is kept. 200 and 500 were the
#: best of ``bench/concurrency_curve.py`` (docs/performance.md).
SLOTS = (50, 100, 200, 500)

#: sa_jobs' slots whose fetches are the floor's size: a busy producer fetches once
#: ``min(slots / 2, FETCH_BATCH_MAX)`` slots are free.
SAME_BATCH_SLOTS = 2 * FETCH_BATCH_MAX


def figures(
    url: URL,
    engine: Engine,
    threads: int,
    jobs: int,
    queues: list[str],
    handler: str,
    fill: Callable[[], None],
    say: Callable[[str], None],
) -> list[Figure]:
    """Drain ``jobs`` jobs (``fill()`` puts them in an empty table) with the floor's
    ``threads`` threads, then with one sa_jobs process at each of :data:`SLOTS`."""
    say(
        f"floor: {threads} threads in 1 process, fetching {floor.THREADS_BATCH} a statement, "
        f"drain {jobs:,} jobs"
    )
    fill()
    theirs = children.drain_costs(
        url,
        engine,
        functools.partial(floor.floor_worker_process, threads=threads),
        1,
        dict.fromkeys(queues, floor.THREADS_BATCH),
        handler,
        jobs,
        probe=True,
    )
    ours: dict[int, dbcost.Drained] = {}
    for slots in SLOTS:
        fill()
        ours[slots] = children.drain_costs(
            url,
            engine,
            noop.worker_process,
            1,
            dict.fromkeys(queues, slots),
            handler,
            jobs,
            probe=True,
        )
        say(f"sa_jobs: 1 process, {slots} slots per queue: {ours[slots].rate:,.0f} jobs/s")
    best = max(ours, key=lambda slots: ours[slots].rate)
    floor_label = f"{threads} threads x fetch {floor.THREADS_BATCH}"
    return [
        Figure(
            "worked_best",
            f"worked no-op jobs, 1 process, best of {'/'.join(map(str, SLOTS))} slots "
            f"({best}) against {floor_label}",
            "jobs/s",
            ours[best].rate,
            theirs.rate,
        ),
        Figure(
            "worker_cpu_per_job_best",
            f"worker CPU per job (user+sys), the best rate's {best} slots against {floor_label}",
            "us",
            ours[best].per_job(ours[best].cpu) * 1e6,
            theirs.per_job(theirs.cpu) * 1e6,
            higher_is_better=False,
        ),
        Figure(
            "worker_cpu_per_job_same_batch",
            f"worker CPU per job (user+sys), {SAME_BATCH_SLOTS} slots (the floor's fetch size) "
            f"against {floor_label}",
            "us",
            ours[SAME_BATCH_SLOTS].per_job(ours[SAME_BATCH_SLOTS].cpu) * 1e6,
            theirs.per_job(theirs.cpu) * 1e6,
            higher_is_better=False,
        ),
        *dbcost.cost_figures(
            "threads_",
            f"{SAME_BATCH_SLOTS} slots against {floor_label}",
            ours[SAME_BATCH_SLOTS],
            theirs,
        ),
    ]
