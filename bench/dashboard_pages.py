"""The dashboard's jobs list on a big table: each filter's page time, and its plan; and
what every jobs page reads beside its rows (its state tabs' counts, its filters' names).

    .venv/bin/python bench/dashboard_pages.py [ROWS]   # default 2,000,000 (~30 s to fill)

Fills a throwaway database with ROWS finished jobs (1 in 500 discarded, 1 in 1,000 of a
rare kind), vacuums it, then times one page of ``sa_jobs.dashboard.job_list.list_jobs``
per filter and prints the plans of the rare-kind page. The figures are in
docs/dashboard.md ("Big tables"), from a run with ROWS=10000000 (70 s in all).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from sqlalchemy import create_engine, event, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.dashboard import job_list, list_choices
from sa_jobs.devdb import find_server, throwaway_database

FILL = """
INSERT INTO sa_job (kind, args, state, queue, attempt, scheduled_at, created_at,
                    attempted_at, finalized_at)
SELECT CASE WHEN g % 1000 = 0 THEN 'rare_kind' ELSE 'common_kind' END,
       jsonb_build_object('n', g, 'email', 'user' || g || '@example.com'),
       CASE WHEN g % 500 = 0 THEN 'discarded' ELSE 'completed' END::sa_job_state,
       CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'default' END, 1,
       now() - make_interval(secs => (:rows - g) * 0.01),
       now() - make_interval(secs => (:rows - g) * 0.01),
       now() - make_interval(secs => (:rows - g) * 0.01),
       now() - make_interval(secs => (:rows - g) * 0.01) + interval '50 ms'
FROM generate_series(1, :rows) g
"""


def main(rows: int) -> None:
    server = find_server()
    try:
        with throwaway_database(server, "sa_jobs_dashboard_bench") as url:
            engine = create_engine(url)
            try:
                sa_jobs.migrate(engine)
                with engine.begin() as connection:
                    connection.execute(text(FILL), {"rows": rows})
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    c.execute(text("VACUUM ANALYZE sa_job"))
                measure(engine, rows)
            finally:
                engine.dispose()
    finally:
        server.stop()


def measure(engine: object, rows: int) -> None:
    cases = [
        ("no filter", job_list.ListFilter(), None),
        ("no filter, a page half-way down", job_list.ListFilter(), rows // 2),
        ("state=discarded (1 in 500)", job_list.ListFilter(state=sa_jobs.JobState.DISCARDED), None),
        ("kind=rare_kind (1 in 1000)", job_list.ListFilter(kind="rare_kind"), None),
        ("text in args matching one old row", job_list.ListFilter(text="user1234@"), None),
        ("kind that does not exist", job_list.ListFilter(kind="missing"), None),
    ]
    with Session(engine) as session:  # type: ignore[call-overload]
        for name, jobs_filter, before in cases:
            start = time.perf_counter()
            page = job_list.list_jobs(session, jobs_filter, before)
            elapsed = (time.perf_counter() - start) * 1000
            print(
                f"{name}: {len(page.rows)} rows, next={page.next}, "
                f"searched_to={page.searched_to}, {elapsed:.0f} ms"
            )
        # What every jobs page reads beside its rows: the state tabs' counts (stats()'s
        # capped counts) and the names the queue and kind filters suggest; stats() itself
        # (the overview's counts) in the same conditions, for comparison. Median of 3.
        measured: list[tuple[str, Callable[[], object]]] = [
            ("state tabs and filter names", lambda: list_choices.list_choices(session)),
            ("state tabs of queue mail", lambda: list_choices.list_choices(session, "mail")),
            ("the kinds suggested alone", lambda: list_choices._kinds(session)),
            ("sa_jobs.stats() (the overview's counts)", lambda: sa_jobs.stats(session)),
        ]
        for name, read in measured:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                read()
                times.append((time.perf_counter() - start) * 1000)
            print(f"{name}: median {sorted(times)[1]:.0f} ms (first {times[0]:.0f} ms)")
    sent: list[tuple[str, object]] = []

    def grab(conn: object, cursor: object, statement: str, parameters: object, *_: object) -> None:
        sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", grab)
    with Session(engine) as session:  # type: ignore[call-overload]
        job_list.list_jobs(session, job_list.ListFilter(kind="rare_kind"), None)
    event.remove(engine, "before_cursor_execute", grab)
    with engine.connect() as connection:  # type: ignore[attr-defined]
        for statement, parameters in sent[-2:]:
            plan = connection.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, parameters
            ).all()
            print("\n".join(row[0] for row in plan), end="\n---\n")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
