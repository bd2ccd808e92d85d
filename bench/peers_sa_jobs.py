"""sa_jobs' side of ``bench/peers.py``: one turn of its measurements, printed as JSON.

Runs in the interpreter ``bench/peers.py`` is given for sa_jobs, with the checkout first
on ``PYTHONPATH`` (the working tree's sa_jobs is what is measured). On a throwaway
database it creates on the server and drops at the end, with the pieces of
``sa-jobs bench`` (``sa_jobs.benchmark``), so the figures are the command's:

* single enqueue: ``sa_jobs.insert(session, BenchNoop(seq))`` in a new ``Session`` and
  transaction per job;
* bulk enqueue: ``insert_many`` of ``--batch`` jobs a transaction (returns the jobs),
  timed on every fill; and ``insert_many_fast`` (``COPY``, returns a count) of
  ``--jobs`` jobs once a turn;
* worked jobs/s: for each ``N`` in ``--slots``, ``--jobs`` jobs drained by one spawned
  worker process with ``queues={"default": N}`` and a sync no-op handler, exactly as
  ``sa-jobs bench -q default=N`` drains them (:func:`sa_jobs.benchmark.children.drain`:
  the clock runs from the release of the process, the worker's start included, until no
  job is ``available`` or ``running``).

    PYTHONPATH=. python bench/peers_sa_jobs.py --url postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import sys
import time
from typing import Any

import psycopg
import sqlalchemy
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.benchmark import children, noop
from sa_jobs.benchmark.run import reset
from sa_jobs.devdb import Server, normalize_url, throwaway_database

SINGLE_WARM_UP = 20


def say(message: str) -> None:
    print(f"  [sa_jobs] {message}", file=sys.stderr, flush=True)


def single(engine: Engine, count: int) -> float:
    for seq in range(-SINGLE_WARM_UP, 0):
        with Session(engine) as session, session.begin():
            sa_jobs.insert(session, noop.BenchNoop(seq))
    started = time.perf_counter()
    for seq in range(count):
        with Session(engine) as session, session.begin():
            sa_jobs.insert(session, noop.BenchNoop(seq))
    return count / (time.perf_counter() - started)


def bulk(engine: Engine, jobs: int, batch: int, *, fast: bool = False) -> float:
    """Empty the table, enqueue ``jobs`` in transactions of ``batch`` (timed), vacuum."""
    reset(engine)
    started = time.perf_counter()
    for low in range(0, jobs, batch):
        items = [noop.BenchNoop(seq) for seq in range(low, min(low + batch, jobs))]
        with Session(engine) as session, session.begin():
            if fast:
                sa_jobs.insert_many_fast(session, items)
            else:
                sa_jobs.insert_many(session, items)
    elapsed = time.perf_counter() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
        connection.execute(text("CHECKPOINT"))
    return jobs / elapsed


def turn(options: argparse.Namespace) -> dict[str, Any]:
    server = Server(normalize_url(options.url), "--url")
    with throwaway_database(server, prefix="sa_jobs_peer") as url:
        engine = create_engine(url, pool_size=2)
        try:
            sa_jobs.migrate(engine)
            with engine.connect() as connection:
                version = connection.scalar(text("SHOW server_version"))
            result: dict[str, Any] = {
                "versions": {
                    "sa_jobs": sa_jobs.__version__,
                    "sqlalchemy": sqlalchemy.__version__,
                    "psycopg": psycopg.__version__,
                    "python": platform.python_version(),
                },
                "postgresql": str(version),
                "jobs": options.jobs,
                "worked": {},
            }
            say(f"single enqueue: {options.singles} jobs")
            reset(engine)
            result["single"] = single(engine, options.singles)
            result["bulk_fast"] = bulk(engine, options.jobs, options.batch, fast=True)
            rates = []
            for slots in options.slots:
                rates.append(bulk(engine, options.jobs, options.batch))
                rate, cpu = children.drain(
                    url, engine, noop.worker_process, 1, {"default": slots}, "sync", options.jobs
                )
                say(f"default={slots}: {rate:,.0f} jobs/s, {cpu * 1e6:.0f} us CPU/job")
                result["worked"][str(slots)] = {"rate": rate, "cpu_us": cpu * 1e6}
            result["bulk"] = sorted(rates)[len(rates) // 2]
            return result
        finally:
            engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a URL of the server's admin database")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--singles", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--slots", type=int, nargs="+", default=[10, 50, 100, 200])
    options = parser.parse_args()
    # A SIGTERM (bench/peers.py stopped) drops the database through the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(turn(options)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
