"""Worked jobs/s against the worker's slots: does throughput hold as concurrency grows?

Not a test. One throwaway database (``sa_jobs.devdb``); for each concurrency ``N`` in
``--slots`` (default 10, 50, 100, 200, 500) a fresh table of ``--jobs`` no-op jobs
(``insert_many_fast``, then ``VACUUM ANALYZE`` and a checkpoint) is drained by one
``sa-jobs bench`` worker process (:func:`sa_jobs.benchmark.noop.worker_process`,
``queues={"default": N}``), exactly as ``sa-jobs bench --jobs J -q default=N`` drains it.
The concurrencies take turns, round after round, in a shuffled order per round (the
machine is shared and drifts; a block per concurrency would measure the drift). Printed
per concurrency: the median and best jobs/s and worker CPU per job, and the median's
ratio to the first concurrency's.

    python bench/concurrency_curve.py --jobs 20000 --rounds 3
    python bench/concurrency_curve.py --ab     # each concurrency also with the fetch
        # uncapped (producer.FETCH_BATCH_MAX patched away in the worker process): A/B
    python bench/concurrency_curve.py --slots 100 200 --profile /tmp/prof   # cProfile each
    python bench/concurrency_curve.py --slots 200 --rounds 1 --profile /tmp/prof --profile-clock cpu
        # worker process into /tmp/prof/N-round.prof (SA_JOBS_BENCH_PROFILE)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.benchmark import children, noop
from sa_jobs.benchmark.report import environment
from sa_jobs.benchmark.run import batches, reset
from sa_jobs.devdb import find_server, throwaway_database


def uncapped_worker_process(*args: object) -> None:
    """:func:`noop.worker_process` as before issue 28's cap: a fetch takes every free slot."""
    from sa_jobs.worker import producer

    producer.FETCH_BATCH_MAX = 10**9
    noop.worker_process(*args)


def fill(engine: Engine, jobs: int) -> None:
    reset(engine)
    for queue, seqs in batches(jobs, ["default"], 1_000):
        with Session(engine) as session, session.begin():
            sa_jobs.insert_many_fast(session, [noop.BenchNoop(seq) for seq in seqs], queue=queue)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
        connection.execute(text("CHECKPOINT"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, nargs="+", default=[10, 50, 100, 200, 500])
    parser.add_argument("--profile", default=None, help="a directory for cProfile output")
    parser.add_argument(
        "--profile-clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what the profile times: wall clock (waits for locks and the GIL included) or "
        "each thread's CPU time (where the worker's CPU per job goes)",
    )
    parser.add_argument("--ab", action="store_true", help="also run each with the fetch uncapped")
    options = parser.parse_args()
    env = environment()
    print(f"load average at start: {env['load_average']}; {env['cpus']} CPUs", flush=True)
    variants = [
        (n, v)
        for n in options.slots
        for v in (("capped", "uncapped") if options.ab else ("capped",))
    ]
    rates: dict[tuple[int, str], list[float]] = {key: [] for key in variants}
    cpus: dict[tuple[int, str], list[float]] = {key: [] for key in variants}
    shuffler = random.Random(0x5A10B5)
    with throwaway_database(find_server(), prefix="sa_jobs_bench_curve") as url:
        engine = create_engine(url, pool_size=2)
        try:
            sa_jobs.migrate(engine)
            for round_ in range(options.rounds):
                order = list(variants)
                shuffler.shuffle(order)
                for slots, variant in order:
                    fill(engine, options.jobs)
                    if options.profile:
                        os.makedirs(options.profile, exist_ok=True)
                        path = os.path.join(options.profile, f"{slots}-{variant}-{round_}.prof")
                        os.environ[noop.PROFILE_VARIABLE] = path
                        os.environ[noop.PROFILE_CLOCK_VARIABLE] = options.profile_clock
                    target = noop.worker_process if variant == "capped" else uncapped_worker_process
                    rate, cpu = children.drain(
                        url,
                        engine,
                        target,
                        1,
                        {"default": slots},
                        "sync",
                        options.jobs,
                    )
                    rates[slots, variant].append(rate)
                    cpus[slots, variant].append(cpu)
                    print(
                        f"round {round_ + 1}, default={slots} {variant}: {rate:,.0f} jobs/s, "
                        f"{cpu * 1e6:.0f} us CPU/job",
                        flush=True,
                    )
        finally:
            engine.dispose()
    print(f"load average at end: {environment()['load_average']}")
    first = statistics.median(rates[variants[0]])
    print(
        f"\n{'slots':>6} {'fetch':>9} {'median jobs/s':>14} {'best':>8} {'ratio':>6}"
        f" {'CPU us/job':>11}"
    )
    for key in variants:
        median = statistics.median(rates[key])
        print(
            f"{key[0]:>6} {key[1]:>9} {median:>14,.0f} {max(rates[key]):>8,.0f} "
            f"{median / first:>5.2f}x {statistics.median(cpus[key]) * 1e6:>11.0f}"
        )
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    raise SystemExit(code)
