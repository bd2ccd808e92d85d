"""``wait_for`` latency: from the ``COMMIT`` of a job's completion returning to
``wait_for`` returning its output, in another thread of the same process.

Not a test. A throwaway database (``sa_jobs.devdb``) with every branch. For each sample a
job is inserted and fetched; a thread calls ``sa_jobs.wait_for(engine, id, timeout=10,
poll_interval=...)``; once the job is marked watched (and 20 ms more, so the waiter sits
in its wait), the main thread completes it with ``complete_in(session, job,
output=...)`` and notes ``time.perf_counter()`` when ``commit()`` returns; the waiter
notes it when ``wait_for`` returns. The poll interval is 5 s by default, so every sample
is a wake-up by ``NOTIFY``, not a poll. The first 10 samples are warm-up.

    python bench/wait_for_latency.py --samples 200
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database
from sa_jobs.worker.producer import fetch_jobs

WARM_UP = 10


@sa_jobs.job_args(kind="bench_wait_for")
class Task:
    n: int = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    options = parser.parse_args()
    with throwaway_database(find_server(), prefix="sa_jobs_bench_wait") as url:
        engine = create_engine(url, pool_size=5)
        sa_jobs.migrate(engine)
        latencies: list[float] = []
        try:
            for n in range(options.samples + WARM_UP):
                with Session(engine) as session, session.begin():
                    job_id = sa_jobs.insert(session, Task(n)).job.id
                (job,) = fetch_jobs(engine, "default", 1, "bench")
                returned: list[float] = []
                result: list[Any] = []

                def wait(
                    job_id: int = job_id,
                    result: list[Any] = result,
                    returned: list[float] = returned,
                ) -> None:
                    result.append(
                        sa_jobs.wait_for(
                            engine, job_id, timeout=10, poll_interval=options.poll_interval
                        )
                    )
                    returned.append(time.perf_counter())

                waiter = threading.Thread(target=wait)
                waiter.start()
                watched = text("SELECT output_watched FROM sa_job WHERE id = :i")
                while True:
                    with engine.connect() as connection:
                        if connection.scalar(watched, {"i": job_id}):
                            break
                    time.sleep(0.002)
                time.sleep(0.02)
                with Session(engine) as session:
                    with session.begin():
                        sa_jobs.complete_in(session, job, output={"n": n})
                    committed = time.perf_counter()
                waiter.join(15)
                assert result == [{"n": n}], result
                if n >= WARM_UP:
                    latencies.append((returned[0] - committed) * 1000)
        finally:
            engine.dispose()
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    print(
        f"wait_for latency after COMMIT, {len(latencies)} samples, poll every "
        f"{options.poll_interval:g} s: p50 {cuts[49]:.2f} ms, p90 {cuts[89]:.2f} ms, "
        f"p99 {cuts[98]:.2f} ms, max {max(latencies):.2f} ms"
    )


if __name__ == "__main__":
    main()
