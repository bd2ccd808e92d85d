"""What the ``sa_jobs_output`` branch costs jobs that return nothing: the time per job,
fetch and finish, on a database without the branch and on one with it.

Not a test. Two throwaway databases (``sa_jobs.devdb``): every branch but
``sa_jobs_output``, and every branch. Each variant drains the same jobs through the
worker's own fetch (:func:`fetch_jobs`) and the completer's own write
(:func:`~sa_jobs.complete.finish_in`: plain completions, the arrays statement) on one
thread, batch after batch; the variants take turns, round after round, and each one's
median and best round are printed with their ratios to the first. With the branch the
job table has two more columns (``output`` NULL, ``output_watched`` false) and the
``sa_job_notify_done`` trigger, whose WHEN clause is false for every job here (nobody
waits), so it never calls its function; a third database has the branch with the
trigger disabled, to tell the two costs apart.

    python bench/output_hot_path.py --jobs 5000 --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack

from _shared import database, drain
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._table.schema import BRANCHES, OUTPUT_BRANCH

WITHOUT_OUTPUT = [f"{branch}@head" for branch in BRANCHES if branch != OUTPUT_BRANCH]


@sa_jobs.job_args(kind="bench_output_noop")
class Noop:
    n: int = 0


def fill(engine: Engine, jobs: int) -> None:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Noop(n) for n in range(jobs)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    options = parser.parse_args()
    with ExitStack() as stack:
        variants = {
            "without the output branch": stack.enter_context(
                database("sa_jobs_bench_output", WITHOUT_OUTPUT)
            ),
            "with the output branch": stack.enter_context(
                database("sa_jobs_bench_output", ["heads"])
            ),
            "with it, trigger disabled": stack.enter_context(
                database("sa_jobs_bench_output", ["heads"])
            ),
        }
        with variants["with it, trigger disabled"].begin() as connection:
            connection.execute(text("ALTER TABLE sa_job DISABLE TRIGGER sa_job_notify_done"))
        per_job: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(options.rounds):
            for name, engine in variants.items():
                fill(engine, options.jobs)
                done, seconds = drain(engine, options.batch)
                assert done == options.jobs, (name, done)
                per_job[name].append(seconds / done * 1e6)
        first = next(iter(per_job))
        base, best = statistics.median(per_job[first]), min(per_job[first])
        print(f"{options.jobs:,} jobs a round, batches of {options.batch}, {options.rounds} rounds")
        print(f"{'variant':<28} {'median us/job':>14} {'ratio':>6} {'best':>7} {'ratio':>6}")
        for name, values in per_job.items():
            median, fastest = statistics.median(values), min(values)
            print(
                f"{name:<28} {median:>14.1f} {median / base:>5.2f}x"
                f" {fastest:>7.1f} {fastest / best:>5.2f}x"
            )


if __name__ == "__main__":
    main()
