"""A worker process for the sequence stress test.

Run as ``python -m tests.acceptance.sequence_worker_app`` (from the repository's root) with:

* ``SA_JOBS_TEST_URL`` — the database (required);
* ``SA_JOBS_TEST_WORKER_ID`` — the worker's id (optional);
* ``SA_JOBS_TEST_THREADS`` — jobs run at once in this process (default 8).

Every handler records its start and its end in :data:`RUNS_TABLE`, stamped with the
database's ``clock_timestamp()``. :class:`StressJob` records both in transactions of
its own and is completed by the batched completer; :class:`StressJobInTx` records its end
in the session the worker completes it in (``complete_in``'s path), so for those jobs
"end" and "completed" commit together.

The sequence repair pass still runs (so a stall cannot hang the test), but every time it
finds something to restart it says so in :data:`REPAIRS_TABLE`: promotions are supposed
to happen when jobs finish, never by maintenance.

The test imports this module for the args classes and the DDL; nothing runs on import.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, SequenceOpts, Worker
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from tests.helpers import fast_maintenance

RUNS_TABLE = "sequence_stress_runs"
REPAIRS_TABLE = "sequence_stress_repairs"
DDL = (
    f"""
    CREATE TABLE {RUNS_TABLE} (
        job_id bigint NOT NULL,
        attempt int NOT NULL,
        seq int NOT NULL,
        pid int NOT NULL,
        event text NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    f"""
    CREATE TABLE {REPAIRS_TABLE} (
        pid int NOT NULL,
        restarted int NOT NULL,
        what text NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
)

#: Rescue far beyond the test's length: a slow machine must not make jobs run twice.
MAINTENANCE = fast_maintenance(
    heartbeat_interval=0.5, rescue_after=60.0, leader_ttl=2.0, scheduler_interval=0.1
)
#: Handlers sleep up to this long, so runs of different sequences overlap.
MAX_SLEEP = 0.004


@sa_jobs.job_args(kind="sequence_stress", sequence=SequenceOpts(by_args=True))
class StressJob:
    seq: int = sa_jobs.field(sequence=True)
    n: int = 0


@sa_jobs.job_args(kind="sequence_stress_in_tx", sequence=SequenceOpts(by_args=True))
class StressJobInTx:
    seq: int = sa_jobs.field(sequence=True)
    n: int = 0


_INSERT_RUN = text(
    f"INSERT INTO {RUNS_TABLE} (job_id, attempt, seq, pid, event)"
    " VALUES (:job_id, :attempt, :seq, :pid, :event)"
)


def _record(bind: Connection | Session, job: Job, event: str) -> None:
    bind.execute(
        _INSERT_RUN,
        {
            "job_id": job.id,
            "attempt": job.attempt,
            "seq": job.args.seq,
            "pid": os.getpid(),
            "event": event,
        },
    )


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    url = os.environ["SA_JOBS_TEST_URL"]
    threads = int(os.environ.get("SA_JOBS_TEST_THREADS", "8"))
    engine = create_engine(url, pool_size=threads + 6, max_overflow=10)
    records: Engine = create_engine(url, pool_size=threads + 2, max_overflow=10)

    original_repair = SequenceRepair.run_once

    def reporting_repair(self: SequenceRepair, connection: Connection) -> int:
        restarted = original_repair(self, connection)
        if restarted:
            connection.execute(
                text(
                    f"INSERT INTO {REPAIRS_TABLE} (pid, restarted, what)"
                    " VALUES (:pid, :n, 'sequence repair')"
                ),
                {"pid": os.getpid(), "n": restarted},
            )
        return restarted

    SequenceRepair.run_once = reporting_repair  # type: ignore[method-assign]

    # No stress job is scheduled or fails, so the scheduler should never have a sequenced
    # job to make available: if it does, a promotion came out `scheduled`.
    original_schedule = Scheduler.run_once

    def reporting_schedule(self: Scheduler, connection: Connection) -> int:
        late = connection.scalar(
            text(
                "SELECT count(*) FROM sa_job WHERE sequence_key IS NOT NULL"
                " AND state IN ('scheduled', 'retryable') AND scheduled_at <= now()"
            )
        )
        made_available = original_schedule(self, connection)
        if late:
            connection.execute(
                text(
                    f"INSERT INTO {REPAIRS_TABLE} (pid, restarted, what) VALUES (:pid, :n, :what)"
                ),
                {"pid": os.getpid(), "n": late, "what": "scheduler"},
            )
        return made_available

    Scheduler.run_once = reporting_schedule  # type: ignore[method-assign]

    worker = Worker(
        engine,
        queues={"default": threads},
        job_timeout=None,
        poll_interval=1.0,
        maintenance=MAINTENANCE,
        interrupt_grace=2.0,
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
    )

    @worker.handler(StressJob)
    def stress(job: Job) -> None:
        with records.begin() as connection:
            _record(connection, job, "start")
        time.sleep(random.uniform(0, MAX_SLEEP))
        with records.begin() as connection:
            _record(connection, job, "end")

    @worker.handler(StressJobInTx)
    def stress_in_tx(job: Job, session: Session) -> None:
        with records.begin() as connection:
            _record(connection, job, "start")
        time.sleep(random.uniform(0, MAX_SLEEP))
        _record(session, job, "end")

    worker.run()
    logging.getLogger("sequence_worker_app").info("worker.run() returned; exiting")
    engine.dispose()
    records.dispose()


if __name__ == "__main__":
    main()
