"""The workflow pages, the CLI's ``workflows show`` and the pending-steps count on a
100,000-step workflow: each read's time, against a 10-step one.

    .venv/bin/python bench/dashboard_workflow_pages.py [STEPS]   # default 100,000

Inserts, in a throwaway database, a fan-out workflow of STEPS steps (one root, every
other step waiting for it: the root has STEPS - 1 dependents) and a diamond of 4 steps,
vacuums, then times each read a page makes (median of 5). The figures are in
docs/dashboard.md ("Big tables").
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._inspect.job_counts import pending_steps
from sa_jobs.dashboard import workflow_view
from sa_jobs.devdb import find_server, throwaway_database


@sa_jobs.job_args(kind="bench_wf_step")
class Step:
    n: int = 0


def fan_out(steps: int) -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow(f"fan-out of {steps}")
    root = wf.add(Step(0), name="root")
    for n in range(1, steps):
        wf.add(Step(n), name=f"s{n:06d}", after=[root])
    return wf


def diamond() -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow("diamond")
    a = wf.add(Step(1), name="a")
    b = wf.add(Step(2), name="b", after=[a])
    c = wf.add(Step(3), name="c", after=[a])
    wf.add(Step(4), name="d", after=[b, c])
    return wf


def timed(engine: Any, read: Callable[[Session], object]) -> float:
    runs = []
    for _ in range(5):
        with Session(engine) as session:
            started = time.perf_counter()
            read(session)
            runs.append(time.perf_counter() - started)
    return statistics.median(runs) * 1000


def main(steps: int) -> None:
    with throwaway_database(find_server()) as url:
        engine = create_engine(url)
        sa_jobs.migrate(engine)
        started = time.perf_counter()
        with Session(engine) as session, session.begin():
            big = sa_jobs.insert_workflow(session, fan_out(steps))
            small = sa_jobs.insert_workflow(session, diamond())
        print(f"inserted {steps:,} steps in {time.perf_counter() - started:.1f} s")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE"))
        root, last = big.jobs["root"], big.jobs[f"s{steps - 1:06d}"]
        reads: list[tuple[str, Callable[[int, int, int], Callable[[Session], object]]]] = [
            ("workflows list", lambda w, r, s: lambda x: workflow_view.list_workflows(x)),
            ("workflow page", lambda w, r, s: lambda x: workflow_view.workflow_detail(x, w)),
            (
                "workflow page, last page of steps",
                lambda w, r, s: lambda x: workflow_view.workflow_detail(x, w, "s099900"),
            ),
            ("job page: root's place", lambda w, r, s: lambda x: workflow_view.step_place(x, r)),
            ("job page: a leaf's place", lambda w, r, s: lambda x: workflow_view.step_place(x, s)),
            ("pending steps (stats)", lambda w, r, s: lambda x: pending_steps(x.connection())),
        ]
        print(f"{'read':40} {'100,000-step':>14} {'4-step':>10}")
        for name, make in reads:
            a = timed(engine, make(big.id, root, last))
            b = timed(engine, make(small.id, small.jobs["a"], small.jobs["d"]))
            print(f"{name:40} {a:11.1f} ms {b:7.1f} ms")
        engine.dispose()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
