"""The worker of the failover tests: ``sa-jobs work tests.failover.failover_app:make_worker
--processes 2``, run from the repository's root.

Its engine is ``$SA_JOBS_FAILOVER_URL``, the cluster's multi-host URL, built as
``docs/operations.md`` says for failover. Every handler first appends a line to
``$SA_JOBS_FAILOVER_RUNS/<pid>.runs`` — ``<unix time> <job id> <attempt> <token>`` — a
file that survives the database going away, so the test counts every execution,
duplicates included. It fires ``Beat`` every second (``catch_up="all"``: each instant
once, none skipped), polls rarely (``SA_JOBS_FAILOVER_POLL``, default 5 s) so that a
quick pickup proves a NOTIFY woke it, and runs maintenance fast enough to watch the
lease and the rescuer move to the new primary within the test.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

import sa_jobs
from sa_jobs import Job, MaintenanceConfig, PeriodicJob, Worker

QUEUE = "failover"
BEAT = "failover_beat"
#: Concurrency of each process.
CONCURRENCY = 4


@sa_jobs.job_args(kind="failover_work", queue=QUEUE)
class Work:
    token: str
    seconds: float = 0.05


@sa_jobs.job_args(
    kind="failover_sequenced", queue=QUEUE, sequence=sa_jobs.SequenceOpts(by_args=True)
)
class Sequenced:
    stream: int = sa_jobs.field(sequence=True)
    token: str = ""
    seconds: float = 0.02


@sa_jobs.job_args(kind="failover_beat", queue=QUEUE)
class Beat:
    pass


#: Maintenance for a test that lasts seconds: a process's jobs are rescued 3 s after
#: its last heartbeat, the lease is taken over within a second.
MAINTENANCE = MaintenanceConfig(
    heartbeat_interval=0.3,
    rescue_after=3.0,
    leader_ttl=1.0,
    scheduler_interval=0.1,
    rescuer_interval=0.2,
    periodic_interval=0.1,
)


def engine_settings() -> dict[str, Any]:
    """What docs/operations.md ("Failover") says to give a worker's engine."""
    return {"pool_size": CONCURRENCY + 4, "pool_pre_ping": False}


def make_worker() -> Worker:
    runs = Path(os.environ["SA_JOBS_FAILOVER_RUNS"]) / f"{os.getpid()}.runs"
    engine = create_engine(os.environ["SA_JOBS_FAILOVER_URL"], **engine_settings())
    worker = Worker(
        engine,
        queues={QUEUE: CONCURRENCY},
        poll_interval=float(os.environ.get("SA_JOBS_FAILOVER_POLL", "5")),
        maintenance=MAINTENANCE,
        periodic=[PeriodicJob(dt.timedelta(seconds=1), Beat(), name=BEAT, catch_up="all")],
    )

    def record(job: Job[Any], token: str) -> None:
        with runs.open("a") as out:
            out.write(f"{time.time():.6f} {job.id} {job.attempt} {token}\n")

    @worker.handler(Work)
    def work(job: Job[Work]) -> None:
        record(job, job.args.token)
        time.sleep(job.args.seconds)  # the job's work: runs are in flight at the kill

    @worker.handler(Sequenced)
    def sequenced(job: Job[Sequenced]) -> None:
        record(job, job.args.token)
        time.sleep(job.args.seconds)

    @worker.handler(Beat)
    def beat(job: Job[Beat]) -> None:
        record(job, "beat")

    return worker
