"""What the ``sa_job_notify_done`` trigger costs a completion nobody waits for, measured
inside the server (no driver, no client round trips in the figure).

Not a test. A throwaway database with every branch; ``--jobs`` running rows. Each round
completes them all, ten at a time, with the completer's statement shape (``UPDATE sa_job
SET state = 'completed', finalized_at = now() WHERE id = ANY(...) AND state =
'running'``) in a PL/pgSQL loop timed by ``clock_timestamp()``, then puts them back to
``running``. Rounds alternate between the trigger enabled and disabled; the median and
best round of each are printed.

    python bench/output_trigger_cost.py --jobs 20000 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics

from sqlalchemy import create_engine, text

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database

COMPLETE_ALL = """
DO $$
DECLARE
    started timestamptz := clock_timestamp();
    last bigint := (SELECT max(id) FROM sa_job);
BEGIN
    FOR lo IN 1..last BY 10 LOOP
        UPDATE sa_job SET state = 'completed', finalized_at = now()
        WHERE id = ANY(ARRAY(SELECT generate_series(lo, lo + 9)))
          AND state = 'running';
    END LOOP;
    PERFORM set_config('bench.took', (extract(epoch FROM clock_timestamp() - started)
        * 1e6)::text, false);
END
$$
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    took: dict[bool, list[float]] = {True: [], False: []}
    with throwaway_database(find_server(), prefix="sa_jobs_bench_trigger") as url:
        engine = create_engine(url, pool_size=1)
        sa_jobs.migrate(engine)
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(
                    text(
                        "INSERT INTO sa_job (kind, state, attempt, attempted_at) "
                        "SELECT 'bench', 'running', 1, now() FROM generate_series(1, :n)"
                    ),
                    {"n": options.jobs},
                )
                c.execute(text("VACUUM ANALYZE sa_job"))
                for round_ in range(options.rounds * 2):
                    enabled = round_ % 2 == 0
                    action = "ENABLE" if enabled else "DISABLE"
                    c.execute(text(f"ALTER TABLE sa_job {action} TRIGGER sa_job_notify_done"))
                    c.exec_driver_sql(COMPLETE_ALL)
                    took[enabled].append(
                        float(c.scalar(text("SELECT current_setting('bench.took')"))) / options.jobs
                    )
                    c.execute(text("ALTER TABLE sa_job DISABLE TRIGGER sa_job_notify_done"))
                    c.execute(text("UPDATE sa_job SET state = 'running', finalized_at = NULL"))
                    c.execute(text("VACUUM sa_job"))
        finally:
            engine.dispose()
    base, best = statistics.median(took[False]), min(took[False])
    print(f"{options.jobs:,} completions a round, 10 per statement, {options.rounds} rounds each")
    for enabled, label in ((False, "trigger disabled"), (True, "trigger enabled")):
        median, fastest = statistics.median(took[enabled]), min(took[enabled])
        print(
            f"{label:<18} median {median:6.2f} us/job {median / base:5.3f}x   "
            f"best {fastest:6.2f} us/job {fastest / best:5.3f}x"
        )


if __name__ == "__main__":
    main()
