"""What workflows cost: plain jobs on a database with and without the branch, a
1,000-step insert, a fan-out/fan-in drained, and the release of a chain's next step.

Not a test. Two throwaway databases (``sa_jobs.devdb``): every branch but
``sa_jobs_workflow``, and every branch. Jobs are drained through the worker's own fetch
and completer write, on one thread; variants take turns, round after round; medians and
best rounds are printed.

1. **Hot path**: plain jobs, without and with the branch (the finishing statements
   return ``workflow_id``; nothing else changes).
2. **Insert**: ``insert_workflow`` of a 1,000-job batch vs ``insert_many`` of 1,000.
3. **Fan-out/fan-in**: 1 → 1,000 → 1 drained vs 1,002 plain jobs drained.
4. **Chain**: each completion of a 200-step chain (``complete_in``, which releases the
   next step) vs completing 200 plain jobs one by one; p50 per completion.

    python bench/workflow_costs.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack

from _shared import database, drain
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._table.schema import BRANCHES, WORKFLOW_BRANCH, Features
from sa_jobs.worker.producer import fetch_jobs

WITHOUT = [f"{branch}@head" for branch in BRANCHES if branch != WORKFLOW_BRANCH]


@sa_jobs.job_args(kind="bench_wf_noop")
class Noop:
    n: int = 0


def reset(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
        if Features.of(connection).workflow:
            connection.execute(text("TRUNCATE sa_job_workflow, sa_job_dep"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))


def timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def insert_plain(engine: Engine, n: int) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Noop(i) for i in range(n)])


def insert_batch(engine: Engine, n: int) -> None:
    batch = sa_jobs.Batch("bench", on_complete=Noop(-1))
    batch.add_many(Noop(i) for i in range(n))
    with Session(engine) as session, session.begin():
        sa_jobs.insert_workflow(session, batch)


def insert_fan(engine: Engine, n: int) -> None:
    wf = sa_jobs.Workflow("fan")
    root = wf.add(Noop(-1), name="root")
    middle = [wf.add(Noop(i), after=[root]) for i in range(n)]
    wf.add(Noop(-2), name="join", after=middle)
    with Session(engine) as session, session.begin():
        sa_jobs.insert_workflow(session, wf)


def complete_one_by_one(engine: Engine, n: int) -> list[float]:
    """Fetch and complete_in each job alone; the time of each completion transaction."""
    with engine.connect() as connection:
        features = Features.of(connection)
    times = []
    for _ in range(n):
        (job,) = fetch_jobs(engine, "default", 1, "bench", features=features)
        began = time.perf_counter()
        with Session(engine) as session, session.begin():
            sa_jobs.complete_in(session, job)
        times.append(time.perf_counter() - began)
    return times


def report(title: str, values: dict[str, list[float]], unit: str, scale: float) -> None:
    first = next(iter(values))
    base, best = statistics.median(values[first]), min(values[first])
    print(f"\n{title}")
    print(f"{'variant':<40} {'median ' + unit:>14} {'ratio':>6} {'best':>9} {'ratio':>6}")
    for name, samples in values.items():
        median, fastest = statistics.median(samples), min(samples)
        print(
            f"{name:<40} {median * scale:>14.1f} {median / base:>5.2f}x"
            f" {fastest * scale:>9.1f} {fastest / best:>5.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with ExitStack() as stack:
        without = stack.enter_context(database("sa_jobs_bench_wf", WITHOUT))
        with_wf = stack.enter_context(database("sa_jobs_bench_wf", ["heads"]))
        hot: dict[str, list[float]] = {
            "plain jobs, no workflow branch": [],
            "plain jobs, workflow branch": [],
        }
        inserts: dict[str, list[float]] = {
            "insert_many of 1,000": [],
            "insert_workflow, Batch of 1,000": [],
        }
        fans: dict[str, list[float]] = {
            "1,002 plain jobs drained": [],
            "1 -> 1,000 -> 1 drained": [],
        }
        chains: dict[str, list[float]] = {
            "complete_in, 200 plain jobs": [],
            "complete_in, 200-step chain": [],
        }
        for _ in range(options.rounds):
            for name, engine in zip(hot, (without, with_wf), strict=True):
                reset(engine)
                insert_plain(engine, options.jobs)
                done, seconds = drain(engine)
                hot[name].append(seconds / done)
            reset(with_wf)
            inserts["insert_many of 1,000"].append(timed(lambda: insert_plain(with_wf, 1000)))
            reset(with_wf)
            inserts["insert_workflow, Batch of 1,000"].append(
                timed(lambda: insert_batch(with_wf, 1000))
            )
            reset(with_wf)
            insert_plain(with_wf, 1002)
            fans["1,002 plain jobs drained"].append(drain(with_wf)[1])
            reset(with_wf)
            insert_fan(with_wf, 1000)
            done, seconds = drain(with_wf)
            assert done == 1002, done
            fans["1 -> 1,000 -> 1 drained"].append(seconds)
            reset(with_wf)
            insert_plain(with_wf, 200)
            chains["complete_in, 200 plain jobs"].append(
                statistics.median(complete_one_by_one(with_wf, 200))
            )
            reset(with_wf)
            with Session(with_wf) as session, session.begin():
                sa_jobs.insert_workflow(session, sa_jobs.chain(*(Noop(i) for i in range(200))))
            chains["complete_in, 200-step chain"].append(
                statistics.median(complete_one_by_one(with_wf, 200))
            )
        print(f"{options.rounds} rounds")
        report(f"Hot path ({options.jobs:,} jobs a round, batches of 10)", hot, "us/job", 1e6)
        report("Insert", inserts, "ms", 1e3)
        report("Fan-out/fan-in", fans, "ms", 1e3)
        report("Chain: p50 per completion transaction", chains, "ms", 1e3)


if __name__ == "__main__":
    main()
