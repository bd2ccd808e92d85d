"""procrastinate's side of ``bench/peers.py``: one turn of its measurements, printed as JSON.

Runs in ``.venv-peers/`` (procrastinate with psycopg 3 and psycopg_pool; not sa_jobs'
dependencies), started by ``bench/peers.py``, which documents the settings and why they
are fair. On a throwaway database it creates on the server and drops at the end:

* single enqueue: ``await noop.defer_async(seq=...)`` per job through an ``App`` on the
  ``PsycopgConnector`` (its standard, async, connector): one pooled connection, one
  statement and its commit, one transaction a job;
* bulk enqueue: ``noop.batch_defer_async(...)`` of ``--batch`` jobs a call (one
  ``procrastinate_defer_jobs_v1`` statement, one transaction, returning the ids), timed
  on every fill;
* worked jobs/s: for each ``N`` in ``--concurrency``, ``--jobs`` jobs drained by one
  spawned process running ``App.run_worker_async(concurrency=N)`` on asyncio (its
  ``run_worker`` runs on ``asyncio.run``) with an ``async def`` no-op task and a pool of
  ``N + 1`` connections (its docs: for short jobs, as many connections as the
  concurrency, plus one). The clock runs from the release of the process until the
  parent, polling every 5 ms, sees no job ``todo`` or ``doing``, the worker's start
  included; then every job is checked ``succeeded``.

The schema is procrastinate's own (``App.schema_manager.apply_schema_async()``, what
``procrastinate schema --apply`` runs); finished jobs are kept (its default
``delete_jobs="never"``), as sa_jobs keeps its completed rows.

    .venv-peers/bin/python bench/peers_procrastinate.py --url postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import platform
import signal
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import procrastinate
import psycopg
import psycopg_pool

TASK = "noop"
SINGLE_WARM_UP = 20
CHILD_TIMEOUT = 60.0
#: A drain that takes longer has hung (at the issue's 174 jobs/s, 20,000 jobs take 2 min).
DRAIN_TIMEOUT = 900.0
TABLES = "procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers"


def say(message: str) -> None:
    print(f"  [procrastinate] {message}", file=sys.stderr, flush=True)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


# procrastinate warns of an App made in the __main__ module, for tasks defined in modules
# that import __main__ (two Apps then); this script's one task is defined beside its App.
logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)


def make_app(url: str, connections: int) -> tuple[procrastinate.App, Any]:
    """An App on ``url`` with a pool of ``connections``, and its no-op task. The task is
    registered by name, so the worker's App (in its own process) finds the parent's jobs."""
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=url, min_size=connections, max_size=connections
        )
    )

    @app.task(name=TASK)
    async def noop(seq: int) -> None:
        pass

    return app, noop


# ------------------------------------------------------------------ the worker process


def worker_process(
    url: str, concurrency: int, ready: Any, go: Any, stop: Any, results: Any
) -> None:
    asyncio.run(_work(url, concurrency, ready, go, stop, results))


async def _work(url: str, concurrency: int, ready: Any, go: Any, stop: Any, results: Any) -> None:
    loop = asyncio.get_running_loop()
    app, _ = make_app(url, concurrency + 1)
    # The pool is opened (its connections made) before the release, as pgqueuer's side
    # connects before it: the clock times working, not connecting.
    async with app.open_async():
        ready.put(os.getpid())
        await loop.run_in_executor(None, go.wait)
        before = time.process_time()
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
        )
        stopped = loop.run_in_executor(None, stop.wait)
        await asyncio.wait([worker, stopped], return_when=asyncio.FIRST_COMPLETED)
        if worker.done():  # a worker that stopped before the parent said so failed
            worker.result()
            raise RuntimeError("procrastinate's worker stopped by itself")
        after = time.process_time()
        # Cancelling run_worker_async is its graceful stop: running jobs finish first.
        worker.cancel()
        await asyncio.wait([worker], timeout=CHILD_TIMEOUT)
        results.put(after - before)


# ----------------------------------------------------------------------- the parent


async def fill(connection: psycopg.AsyncConnection[Any], noop: Any, jobs: int, batch: int) -> float:
    """Empty the tables, enqueue ``jobs`` in batches (timed), vacuum, checkpoint."""
    await connection.execute(f"TRUNCATE {TABLES}")
    await connection.execute("CHECKPOINT")
    started = time.perf_counter()
    for low in range(0, jobs, batch):
        await noop.batch_defer_async(*({"seq": s} for s in range(low, min(low + batch, jobs))))
    elapsed = time.perf_counter() - started
    await connection.execute("VACUUM ANALYZE procrastinate_jobs")
    await connection.execute("CHECKPOINT")
    return jobs / elapsed


async def single(noop: Any, count: int) -> float:
    for seq in range(-SINGLE_WARM_UP, 0):
        await noop.defer_async(seq=seq)
    started = time.perf_counter()
    for seq in range(count):
        await noop.defer_async(seq=seq)
    return count / (time.perf_counter() - started)


async def fetch_value(connection: psycopg.AsyncConnection[Any], query: str) -> Any:
    cursor = await connection.execute(query)
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def drain(
    url: str, connection: psycopg.AsyncConnection[Any], jobs: int, concurrency: int
) -> tuple[float, float]:
    """Release one worker process on the table's jobs; (jobs/s, worker CPU s per job)."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(
        target=worker_process, args=(url, concurrency, ready, go, stop, results), daemon=True
    )
    child.start()
    loop = asyncio.get_running_loop()
    left = "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    try:
        await loop.run_in_executor(None, ready.get, True, CHILD_TIMEOUT)
        started = time.perf_counter()
        go.set()
        deadline = started + DRAIN_TIMEOUT
        while True:
            await asyncio.sleep(0.005)
            if not await fetch_value(connection, left):
                break
            if not child.is_alive():
                raise SystemExit(f"procrastinate's worker process died ({child.exitcode})")
            if time.perf_counter() > deadline:
                raise SystemExit(f"procrastinate: jobs left after {DRAIN_TIMEOUT:.0f} s")
        elapsed = time.perf_counter() - started
        stop.set()
        cpu = await loop.run_in_executor(None, results.get, True, CHILD_TIMEOUT)
    finally:
        stop.set()
        child.join(CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
    done = await fetch_value(
        connection, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    )
    if done != jobs:
        raise SystemExit(f"procrastinate: {done} of {jobs} jobs succeeded")
    return jobs / elapsed, cpu / jobs


async def turn(options: argparse.Namespace) -> dict[str, Any]:
    name = f"procrastinate_peer_{uuid.uuid4().hex[:12]}"
    admin = await psycopg.AsyncConnection.connect(options.url, autocommit=True)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(options.url, name)
    try:
        connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            # The enqueuing side needs one connection (the statements are sequential).
            app, noop = make_app(url, 1)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                result: dict[str, Any] = {
                    "versions": {
                        "procrastinate": procrastinate.__version__,
                        "psycopg": psycopg.__version__,
                        "psycopg_pool": psycopg_pool.__version__,
                        "python": platform.python_version(),
                    },
                    "postgresql": await fetch_value(connection, "SHOW server_version"),
                    "jobs": options.jobs,
                    "worked": {},
                }
                say(f"single enqueue: {options.singles} jobs")
                result["single"] = await single(noop, options.singles)
                bulk = []
                for concurrency in options.concurrency:
                    bulk.append(await fill(connection, noop, options.jobs, options.batch))
                    rate, cpu = await drain(url, connection, options.jobs, concurrency)
                    say(
                        f"concurrency={concurrency}: {rate:,.0f} jobs/s, {cpu * 1e6:.0f} us CPU/job"
                    )
                    result["worked"][str(concurrency)] = {"rate": rate, "cpu_us": cpu * 1e6}
                result["bulk"] = sorted(bulk)[len(bulk) // 2]
                return result
        finally:
            await connection.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a libpq URL of the server's admin database")
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--singles", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 50, 100])
    options = parser.parse_args()
    # A SIGTERM (bench/peers.py stopped) drops the database through the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(asyncio.run(turn(options))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
