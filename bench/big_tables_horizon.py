"""What dead rows and a pinned xmin horizon cost the fetch, on a big table.

Every job leaves dead row versions behind (available -> running -> completed), and each
of them leaves a dead entry in the fetch index, ahead of the live ones. PostgreSQL skips
such entries cheaply once it knows no transaction can see them (it marks them dead on
first visit), and vacuum removes them. A transaction left open — a stuck handler, an
idle-in-transaction session, a long report — pins the xmin horizon: nothing newer than
its snapshot is dead to everyone, so neither happens, and every fetch walks every dead
entry again (PlanetScale's "death spiral", River #59, procrastinate #1454).

This script measures the fetch (batches of 10, median of ``--fetches``) on the big table
built by ``bench/big_tables.py --database NAME``:

1. as it is (vacuumed);
2. after ``--churn`` jobs went through the queue (inserted, fetched, completed, all
   server-side) while another connection held a REPEATABLE READ snapshot open;
3. the same, once that transaction has ended (no vacuum yet);
4. after ``VACUUM``.

    python bench/big_tables.py --database sa_jobs_big     # build it once
    python bench/big_tables_horizon.py --database sa_jobs_big --churn 100000
"""

from __future__ import annotations

import argparse
import statistics
import time

from sqlalchemy import Engine, create_engine, text

from sa_jobs.devdb import find_server
from sa_jobs.worker.producer import fetch_jobs

# The churned jobs are due earlier than the waiting ones, so their dead entries are
# where every fetch's index scan starts.
CHURN = [
    """
    INSERT INTO sa_job (kind, args, queue, priority, scheduled_at)
    SELECT 'churn', '{}'::jsonb, 'default', 1, now() - interval '2 hours'
    FROM generate_series(1, CAST(:n AS bigint))
    """,
    """
    UPDATE sa_job SET state = 'running', attempt = 1, run_count = 1, attempted_at = now(),
        attempted_by = ARRAY['churn-worker']
    WHERE kind = 'churn' AND state = 'available' AND id >= :first
    """,
    """
    UPDATE sa_job SET state = 'completed', finalized_at = now()
    WHERE kind = 'churn' AND state = 'running' AND id >= :first
    """,
]


def fetch_ms(engine: Engine, fetches: int) -> float:
    """Median milliseconds of a fetch of 10 (the jobs are put back afterwards)."""
    times = []
    taken: list[int] = []
    for _ in range(fetches):
        start = time.perf_counter()
        jobs = fetch_jobs(engine, "default", 10, "horizon-bench")
        times.append(time.perf_counter() - start)
        taken.extend(job.id for job in jobs)
    with engine.begin() as connection:
        # Back to available, so each step fetches from the same queue.
        connection.execute(
            text(
                "UPDATE sa_job SET state = 'available', attempt = 0, attempted_at = NULL,"
                " attempted_by = NULL WHERE id = ANY(:ids)"
            ),
            {"ids": taken},
        )
    return statistics.median(times) * 1000


def dead_tuples(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.scalar(text("SELECT pg_stat_get_dead_tuples('sa_job'::regclass)")) or 0
        )


def churn(engine: Engine, n: int) -> None:
    with engine.connect() as connection:
        first = int(connection.scalar(text("SELECT max(id) + 1 FROM sa_job")) or 1)
    for statement in CHURN:
        with engine.begin() as connection:
            connection.execute(text(statement), {"n": n, "first": first})


def vacuum(engine: Engine) -> float:
    start = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM sa_job"))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="built by bench/big_tables.py")
    parser.add_argument("--churn", type=int, default=100_000, help="jobs through the queue")
    parser.add_argument("--fetches", type=int, default=50)
    options = parser.parse_args()
    engine = create_engine(find_server().url.set(database=options.database))
    vacuum(engine)
    steps = [("vacuumed", fetch_ms(engine, options.fetches), dead_tuples(engine))]

    holder = engine.connect()
    holder.execution_options(isolation_level="REPEATABLE READ")
    holder.begin()
    holder.execute(text("SELECT count(*) FROM sa_job_worker"))  # takes the snapshot
    churn(engine, options.churn)
    step = f"{options.churn:,} churned, an old snapshot open"
    steps.append((step, fetch_ms(engine, options.fetches), dead_tuples(engine)))
    holder.rollback()
    holder.close()
    step = "snapshot closed, not vacuumed"
    steps.append((step, fetch_ms(engine, options.fetches), dead_tuples(engine)))
    took = vacuum(engine)
    step = f"after VACUUM ({took:.1f} s)"
    steps.append((step, fetch_ms(engine, options.fetches), dead_tuples(engine)))
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM sa_job WHERE kind = 'churn'"))
    vacuum(engine)
    engine.dispose()

    print(f"{'step':<45} {'fetch ms':>9} {'ratio':>7} {'n_dead_tup':>11}")
    for name, ms, dead in steps:
        print(f"{name:<45} {ms:>9.3f} {ms / steps[0][1]:>7.2f} {dead:>11,}")


if __name__ == "__main__":
    main()
