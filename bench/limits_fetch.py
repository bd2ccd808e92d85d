"""What limits cost at the fetch: the time per fetched job, fetch and finish, with and
without limits.

Not a test. Two throwaway databases (``sa_jobs.devdb``): one with every branch but
``sa_jobs_limits``, one with every branch. Each variant drains the same jobs through the
worker's own fetch functions on one thread: fetch a batch of ``--batch`` (the free
slots), mark it completed with one UPDATE, repeat. The variants take turns, round after
round; each one's median and best round are printed, with their ratios to the first:

* ``plain, no limits branch`` — :func:`fetch_jobs`, as before limits existed;
* ``plain, limits branch``    — the same statement; the branch's running-jobs index is
  one more index entry per started job;
* ``queue limit``             — :func:`fetch_limited` with a ``ConcurrencyLimit`` on the
  queue, higher than the batch (it never binds, so the work per job is the same);
* ``queue + kind limits``     — a queue limit and a kind limit (the window over kinds);
* ``rate limit``              — a ``RateLimit`` that never binds (the window rows).

    python bench/limits_fetch.py --jobs 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from _shared import database
from sqlalchemy import Engine, func, text, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit, JobState, RateLimit
from sa_jobs._declare.limits import Limit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs.worker.limited_fetch import fetch_limited, plan_limits
from sa_jobs.worker.producer import fetch_jobs

WITHOUT_LIMITS = [
    "sa_jobs_core@head",
    "sa_jobs_unique@head",
    "sa_jobs_sequence@head",
    "sa_jobs_job_key@head",
]


@sa_jobs.job_args(kind="bench_limits_noop")
class Noop:
    n: int = 0


def fill(engine: Engine, jobs: int) -> None:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
        if connection.scalar(text("SELECT to_regclass('sa_job_rate_window') IS NOT NULL")):
            connection.execute(text("TRUNCATE sa_job_rate_window"))
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Noop(n) for n in range(jobs)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))


def drain(engine: Engine, fetch: Callable[[int], list[Any]], batch: int) -> tuple[int, float]:
    finished = update(Job).values(state=JobState.COMPLETED, finalized_at=func.now())
    done = 0
    began = time.perf_counter()
    while jobs := fetch(batch):
        with engine.begin() as connection:
            connection.execute(finished.where(Job.id.in_([job.id for job in jobs])))
        done += len(jobs)
    return done, time.perf_counter() - began


def limited(engine: Engine, limits: list[Limit]) -> Callable[[int], list[Any]]:
    plan = plan_limits(limits, ["default"])["default"]
    with engine.connect() as connection:
        features = Features.of(connection)
    return lambda free: fetch_limited(engine, plan, free, "bench", features=features)


def plain(engine: Engine) -> Callable[[int], list[Any]]:
    with engine.connect() as connection:
        features = Features.of(connection)
    return lambda free: fetch_jobs(engine, "default", free, "bench", features=features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    options = parser.parse_args()
    with ExitStack() as stack:
        bare = stack.enter_context(database("sa_jobs_bench_limits", WITHOUT_LIMITS))
        full = stack.enter_context(database("sa_jobs_bench_limits", ["heads"]))
        never = 10**9
        variants: dict[str, tuple[Engine, Callable[[int], list[Any]]]] = {
            "plain, no limits branch": (bare, plain(bare)),
            "plain, limits branch": (full, plain(full)),
            "queue limit": (
                full,
                limited(full, [ConcurrencyLimit(queue="default", max_running=never)]),
            ),
            "queue + kind limits": (
                full,
                limited(
                    full,
                    [
                        ConcurrencyLimit(queue="default", max_running=never),
                        ConcurrencyLimit(kind=Noop, max_running=never),
                    ],
                ),
            ),
            "rate limit": (
                full,
                limited(full, [RateLimit(queue="default", max_starts=never, per=60)]),
            ),
        }
        per_job: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(options.rounds):
            for name, (engine, fetch) in variants.items():
                fill(engine, options.jobs)
                done, seconds = drain(engine, fetch, options.batch)
                assert done == options.jobs, (name, done)
                per_job[name].append(seconds / done * 1e6)
        base = statistics.median(per_job["plain, no limits branch"])
        best = min(per_job["plain, no limits branch"])
        print(f"{options.jobs:,} jobs a round, batches of {options.batch}, {options.rounds} rounds")
        print(f"{'variant':<26} {'median us/job':>14} {'ratio':>6} {'best':>7} {'ratio':>6}")
        for name, values in per_job.items():
            median, fastest = statistics.median(values), min(values)
            print(
                f"{name:<26} {median:>14.1f} {median / base:>5.2f}x"
                f" {fastest:>7.1f} {fastest / best:>5.2f}x"
            )


if __name__ == "__main__":
    main()
