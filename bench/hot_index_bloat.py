"""How big the fetch index grows under a steady queue, and what the reindexer gives back.

Not a test. A throwaway database (``sa_jobs.devdb``): ``--rounds`` times, ``--batch``
jobs are enqueued (``insert_many_fast``) and finished (one UPDATE), as a busy queue moves
them through ``sa_job_fetch_idx``, with a ``VACUUM`` every ten rounds (autovacuum's
part); 50 jobs stay available. Printed: the hot indexes' sizes, a fetch's time (median of
200 fetches of 10 that are rolled back), then the same after one
:class:`~sa_jobs.worker.maintenance.reindexer.Reindexer` pass, and how long it took.

    python bench/hot_index_bloat.py --rounds 200 --batch 1000 --min-kb 256
"""

from __future__ import annotations

import argparse
import statistics
import time

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.benchmark.noop import BenchNoop
from sa_jobs.benchmark.report import environment
from sa_jobs.devdb import find_server, throwaway_database
from sa_jobs.worker.db_access import autocommit
from sa_jobs.worker.maintenance.reindexer import Reindexer, ReindexSettings
from sa_jobs.worker.producer import jobs_fetch_available

FINISH = text(
    "UPDATE sa_job SET state = 'completed', finalized_at = now() WHERE state = 'available'"
)


def sizes(engine: Engine) -> str:
    with autocommit(engine).connect() as connection:
        found = Reindexer().sizes(connection)
    return ", ".join(f"{size.name} {size.bytes / 1024:,.0f} kB" for size in found)


def fetch_time(engine: Engine) -> float:
    params = {"fetch_queue": "default", "fetch_limit": 10, "fetch_worker_id": "bench"}
    times = []
    with engine.connect() as connection:
        for _ in range(200):
            started = time.perf_counter()
            connection.execute(jobs_fetch_available(), params).all()
            times.append(time.perf_counter() - started)
            connection.rollback()
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--min-kb", type=int, default=1024, help="ReindexSettings.min_bytes / 1024")
    options = parser.parse_args()
    print(f"load average at start: {environment()['load_average']}")
    with throwaway_database(find_server(), prefix="sa_jobs_bench_bloat") as url:
        engine = create_engine(url)
        try:
            sa_jobs.migrate(engine)
            for round_ in range(options.rounds):
                with Session(engine) as session, session.begin():
                    sa_jobs.insert_many_fast(session, [BenchNoop(n) for n in range(options.batch)])
                with engine.begin() as connection:
                    connection.execute(FINISH)
                if round_ % 10 == 9:
                    with autocommit(engine).connect() as connection:
                        connection.execute(text("VACUUM ANALYZE sa_job"))
            with Session(engine) as session, session.begin():
                sa_jobs.insert_many_fast(session, [BenchNoop(n) for n in range(50)])
            with autocommit(engine).connect() as connection:
                connection.execute(text("VACUUM ANALYZE sa_job"))
            jobs = options.rounds * options.batch
            print(f"after {jobs:,} jobs through the queue, 50 available:")
            print(f"  {sizes(engine)}; a fetch of 10: {fetch_time(engine):.3f} ms")
            started = time.perf_counter()
            with autocommit(engine).connect() as connection:
                settings = ReindexSettings(min_bytes=options.min_kb * 1024)
                rebuilt = Reindexer(settings).run_once(connection)
            took = time.perf_counter() - started
            print(f"one reindexer pass: {rebuilt} rebuilt in {took:.2f} s")
            print(f"  {sizes(engine)}; a fetch of 10: {fetch_time(engine):.3f} ms")
        finally:
            engine.dispose()
    print(f"load average at end: {environment()['load_average']}")


if __name__ == "__main__":
    main()
