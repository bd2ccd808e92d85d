"""What fair and key-limited fetches cost per job, against the plain fetch of the same run.

One thread drains jobs through the worker's own fetch functions — fetch a batch of
:data:`BATCH` (a worker's free slots), mark it completed with one UPDATE, repeat — as
``bench/limits_fetch.py`` does for limits. Four variants take turns, round after round,
each on a fresh table of ``2 * keys`` jobs, timing the first ``keys`` jobs drained (so
every key still has a job waiting, and stays *active*, throughout):

* ``fetch_plain`` — a plain queue, jobs without keys (:func:`fetch_jobs`);
* ``fetch_fair`` — ``Queue(n, fair_by=[...])`` over ``keys`` keys, two jobs each;
* ``fetch_key_limited`` — the same keys under ``ConcurrencyLimit(by_args=...)`` that
  never binds (the lock, the per-key count and the caps, the same work per job);
* ``fetch_queue_limited`` — for comparison, the plain jobs under a ``ConcurrencyLimit``
  on the queue that never binds (:mod:`sa_jobs.worker.limited_fetch`): what any limit
  costs, by key or not (a lock and a count before the fetch).

The medians of the rounds are reported, with the ratios to the plain fetch (the issue's
aims: at most 1.5 times for fair, 1.3 times for key-limited) and of the key-limited fetch
to the queue-limited one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, text, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs.benchmark.report import Figure
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import fetch_limited, plan_limits
from sa_jobs.worker.producer import fetch_jobs

__all__ = ["BATCH", "KEYS", "figures"]

#: Active keys (fewer when the run enqueues fewer jobs).
KEYS = 10_000
#: Jobs per fetch.
BATCH = 10
ROUNDS = 3
QUEUE = "sa_jobs_bench_fair"


@sa_jobs.job_args(kind="sa_jobs_bench_tenant", queue=QUEUE, partition_by=["tenant"])
class BenchTenant:
    tenant: str


@sa_jobs.job_args(kind="sa_jobs_bench_untenanted", queue=QUEUE)
class BenchUntenanted:
    tenant: str


def _fill(engine: Engine, keys: int, keyed: bool) -> None:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
    cls = BenchTenant if keyed else BenchUntenanted
    with Session(engine) as session, session.begin():
        # Two jobs per key, the second round after the first (as arrivals would be).
        for _ in range(2):
            sa_jobs.insert_many(session, [cls(f"t{n:05d}") for n in range(keys)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))


def _drain(engine: Engine, fetch: Callable[[int], list[Any]], jobs: int) -> float:
    """Microseconds per job to fetch and finish the first ``jobs``."""
    finished = update(Job).values(state=JobState.COMPLETED, finalized_at=func.now())
    done = 0
    began = time.perf_counter()
    while done < jobs:
        batch = fetch(BATCH)
        if not batch:
            break
        with engine.begin() as connection:
            connection.execute(finished.where(Job.id.in_([job.id for job in batch])))
        done += len(batch)
    return (time.perf_counter() - began) / max(done, 1) * 1e6


def figures(engine: Engine, jobs: int, say: Callable[[str], None]) -> list[Figure]:
    """The four fetches' cost per job, and the ratios; ``jobs`` bounds the keys."""
    keys = max(BATCH, min(KEYS, jobs))
    say(f"fair and key-limited fetches: {keys:,} active keys, {ROUNDS} rounds")
    with engine.connect() as connection:
        features = Features.of(connection)
    limits = [sa_jobs.ConcurrencyLimit(10**9, queue=QUEUE, by_args=["tenant"])]
    fair = KeyedQueue(QUEUE)
    limited = KeyedQueue(QUEUE, plan_limits(limits, [QUEUE])[QUEUE])
    queue_limit = [sa_jobs.ConcurrencyLimit(10**9, queue=QUEUE)]
    queue_plan = plan_limits(queue_limit, [QUEUE])[QUEUE]
    variants: dict[str, tuple[bool, Callable[[int], list[Any]]]] = {
        "plain": (False, lambda free: fetch_jobs(engine, QUEUE, free, "bench", features=features)),
        "fair": (True, lambda free: fetch_keyed(engine, fair, free, "bench", features=features)),
        "key_limited": (
            True,
            lambda free: fetch_keyed(engine, limited, free, "bench", features=features),
        ),
        "queue_limited": (
            False,
            lambda free: fetch_limited(engine, queue_plan, free, "bench", features=features),
        ),
    }
    per_job: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, (keyed, fetch) in variants.items():
            _fill(engine, keys, keyed)
            per_job[name].append(_drain(engine, fetch, keys))
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
    median = {name: statistics.median(times) for name, times in per_job.items()}
    return [
        Figure(
            "fetch_plain",
            f"fetch + finish, plain queue, {BATCH}/fetch",
            "us",
            median["plain"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_fair",
            f"fetch + finish, fair queue, {keys:,} active keys",
            "us",
            median["fair"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_key_limited",
            f"fetch + finish, limit by key, {keys:,} active keys",
            "us",
            median["key_limited"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_fair_ratio",
            "fair / plain fetch, per job (aim: <= 1.5)",
            "x",
            median["fair"] / median["plain"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_key_limited_ratio",
            "key-limited / plain fetch, per job (aim: <= 1.3)",
            "x",
            median["key_limited"] / median["plain"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_queue_limited",
            f"fetch + finish, limit on the queue (not by key), {BATCH}/fetch",
            "us",
            median["queue_limited"],
            higher_is_better=False,
        ),
        Figure(
            "fetch_key_limited_vs_queue_limited",
            "key-limited / queue-limited fetch, per job",
            "x",
            median["key_limited"] / median["queue_limited"],
            higher_is_better=False,
        ),
    ]
