"""A worker process with one periodic job, for the acceptance tests.

Run as ``python -m tests.acceptance.periodic_app`` with ``SA_JOBS_TEST_URL`` and
``SA_JOBS_TEST_WORKER_ID``. It fires ``every_second`` (a 1-second interval,
``catch_up="all"``), ticking every 0.1 s. With ``SA_JOBS_TEST_PAUSE_TICK=1`` each tick
that inserted jobs prints ``PAUSED <job ids>`` and sleeps before its commit — the window
in which the test kills the process with SIGKILL (or leaves it paused, row locked).

Also: ``SA_JOBS_TEST_NO_PERIODIC=1`` — a worker without periodic jobs (a plain process
that can lead and rescue); ``SA_JOBS_TEST_LONG_QUEUE=1`` — it also works queue
``long``, whose ``Nap`` jobs sleep their ``seconds``; ``SA_JOBS_TEST_REGISTER_INTERVAL``
— re-register its periodic jobs this often (seconds) instead of every minute.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import time
from typing import Any

import attrs
from sqlalchemy import Connection, create_engine

import sa_jobs
from sa_jobs import Job, PeriodicJob, Worker
from sa_jobs.worker.maintenance import periodic
from sa_jobs.worker.maintenance.periodic import PeriodicTicker
from tests.helpers import FAST_RESCUE

NAME = "every_second"


@sa_jobs.job_args(kind="acceptance_periodic")
class Beat:
    pass


@sa_jobs.job_args(kind="acceptance_nap", queue="long")
class Nap:
    seconds: float = 1.0


def _pause_before_commit(ids: list[int]) -> None:
    print(f"PAUSED {' '.join(map(str, ids))}", flush=True)
    time.sleep(600)


def _pausing_ticks() -> None:
    original = PeriodicTicker.run_once

    def run_once(self: PeriodicTicker, connection: Connection) -> int:
        self.before_commit = _pause_before_commit
        return original(self, connection)

    PeriodicTicker.run_once = run_once  # type: ignore[method-assign]


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    if os.environ.get("SA_JOBS_TEST_PAUSE_TICK"):
        _pausing_ticks()
    if interval := os.environ.get("SA_JOBS_TEST_REGISTER_INTERVAL"):
        periodic.REGISTER_INTERVAL = float(interval)
    engine = create_engine(os.environ["SA_JOBS_TEST_URL"], pool_size=5)
    queues = {"default": 2}
    if os.environ.get("SA_JOBS_TEST_LONG_QUEUE"):
        queues["long"] = 1
    jobs = [PeriodicJob(dt.timedelta(seconds=1), Beat(), name=NAME, catch_up="all")]
    worker = Worker(
        engine,
        queues=queues,
        poll_interval=0.5,
        maintenance=attrs.evolve(FAST_RESCUE, periodic_interval=0.1),
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
        periodic=[] if os.environ.get("SA_JOBS_TEST_NO_PERIODIC") else jobs,
    )

    @worker.handler(Beat)
    def beat(job: Job[Any]) -> None:
        pass

    @worker.handler(Nap)
    def nap(job: Job[Nap]) -> None:
        time.sleep(job.args.seconds)

    worker.run()
    engine.dispose()


if __name__ == "__main__":
    main()
