"""The resident memory of a worker process while it drains N no-op jobs.

Not a test. It creates a throwaway database (``sa_jobs.devdb``), bulk-inserts N jobs,
starts a ``Worker(engine, queues={"default": 20})`` with a sync no-op handler in this
process, and prints the process's RSS eight times during the drain. Flat is the aim:
nothing the worker keeps may grow with the number of jobs it has worked.

    python bench/worker_memory.py 400000
"""

from __future__ import annotations

import os
import sys
import threading
import time

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database


@sa_jobs.job_args(kind="bench_memory_noop")
class Noop:
    n: int = 0


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(jobs: int) -> None:
    with throwaway_database(find_server(), prefix="sa_jobs_bench_memory") as url:
        engine = create_engine(url, pool_size=20)
        sa_jobs.migrate(engine)
        for start in range(0, jobs, 10_000):
            with Session(engine) as session, session.begin():
                batch = [Noop(n) for n in range(start, min(jobs, start + 10_000))]
                sa_jobs.insert_many(session, batch)
        worker = sa_jobs.Worker(engine, queues={"default": 20})
        done = 0
        lock = threading.Lock()

        @worker.handler(Noop)
        def noop(job: sa_jobs.Job[Noop]) -> None:
            nonlocal done
            with lock:
                done += 1

        worker.start()
        began = time.monotonic()
        mark = 0
        while done < jobs:
            if done >= mark:
                print(
                    f"{done:>9,} jobs  rss {rss_mib():7.1f} MiB  {time.monotonic() - began:6.1f} s"
                )
                mark += max(1, jobs // 8)
            time.sleep(0.05)
        print(f"{done:>9,} jobs  rss {rss_mib():7.1f} MiB  {time.monotonic() - began:6.1f} s")
        worker.stop()
        engine.dispose()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400_000)
