"""pgqueuer's side of ``bench/peers.py``: one turn of its measurements, printed as JSON.

Runs in ``.venv-peers/`` (pgqueuer, asyncpg, uvloop; not sa_jobs' dependencies), started
by ``bench/peers.py``, which documents the settings and why they are fair. On a throwaway
database it creates on the server and drops at the end:

* single enqueue: ``await queries.enqueue("noop", payload)`` per job on one asyncpg
  connection (one statement in autocommit: one transaction a job);
* bulk enqueue: ``queries.enqueue([...], [...], [...])`` of ``--batch`` jobs a
  statement (pgqueuer's ``unnest`` insert, which returns the ids), timed on every fill;
* worked jobs/s: for each ``MxB`` in ``--configs``, ``--jobs`` jobs drained by one spawned
  process running ``M`` ``QueueManager`` s (each on its own asyncpg connection, as
  pgqueuer's own ``tools/benchmark.py`` runs its dequeue tasks) with ``batch_size=B``, on
  uvloop, an ``async def`` no-op entrypoint. The clock runs from the release of the
  process until the parent, polling every 5 ms, sees the queue table empty (pgqueuer
  deletes a job when its completion is logged), the managers' start included.

The schema is pgqueuer's default (``durable``: every table logged, as sa_jobs' are), with
the autovacuum settings its performance guide's checklist applies (``pgq autovac``).

    .venv-peers/bin/python bench/peers_pgqueuer.py --url postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer import __version__ as pgqueuer_version

ENTRYPOINT = "noop"
SINGLE_WARM_UP = 20
CHILD_TIMEOUT = 60.0
#: A drain that takes longer has hung (20,000 jobs take a few seconds).
DRAIN_TIMEOUT = 600.0


def say(message: str) -> None:
    print(f"  [pgqueuer] {message}", file=sys.stderr, flush=True)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def payload(seq: int) -> bytes:
    return json.dumps({"seq": seq}, separators=(",", ":")).encode()


# ------------------------------------------------------------------ the worker process


def worker_process(
    url: str, managers: int, batch: int, ready: Any, go: Any, stop: Any, results: Any
) -> None:
    uvloop.run(_work(url, managers, batch, ready, go, stop, results))


async def _work(
    url: str, managers: int, batch: int, ready: Any, go: Any, stop: Any, results: Any
) -> None:
    loop = asyncio.get_running_loop()
    connections = [await asyncpg.connect(url) for _ in range(managers)]
    qms = [QueueManager(Queries(AsyncpgDriver(connection))) for connection in connections]
    for qm in qms:

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            pass

    ready.put(os.getpid())
    await loop.run_in_executor(None, go.wait)
    before = time.process_time()
    runs = [asyncio.create_task(qm.run(batch_size=batch)) for qm in qms]
    stopped = loop.run_in_executor(None, stop.wait)
    await asyncio.wait([*runs, stopped], return_when=asyncio.FIRST_COMPLETED)
    for run in runs:
        if run.done():  # a manager that stopped before the parent said so failed
            run.result()
            raise RuntimeError("a QueueManager stopped by itself")
    after = time.process_time()
    for qm in qms:
        qm.shutdown.set()
    await asyncio.wait_for(asyncio.gather(*runs), CHILD_TIMEOUT)
    results.put(after - before)
    for connection in connections:
        await connection.close()


# ----------------------------------------------------------------------- the parent


async def fill(connection: asyncpg.Connection, queries: Queries, jobs: int, batch: int) -> float:
    """Empty the tables, enqueue ``jobs`` in batches (timed), vacuum, checkpoint."""
    await connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
    await connection.execute("CHECKPOINT")
    started = time.perf_counter()
    for low in range(0, jobs, batch):
        seqs = range(low, min(low + batch, jobs))
        await queries.enqueue([ENTRYPOINT] * len(seqs), [payload(s) for s in seqs], [0] * len(seqs))
    elapsed = time.perf_counter() - started
    await connection.execute("VACUUM ANALYZE pgqueuer")
    await connection.execute("CHECKPOINT")
    return jobs / elapsed


async def single(queries: Queries, count: int) -> float:
    for seq in range(-SINGLE_WARM_UP, 0):
        await queries.enqueue(ENTRYPOINT, payload(seq))
    started = time.perf_counter()
    for seq in range(count):
        await queries.enqueue(ENTRYPOINT, payload(seq))
    return count / (time.perf_counter() - started)


async def drain(
    url: str, connection: asyncpg.Connection, jobs: int, managers: int, batch: int
) -> tuple[float, float]:
    """Release one worker process on the table's jobs; (jobs/s, worker CPU s per job)."""
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(
        target=worker_process, args=(url, managers, batch, ready, go, stop, results), daemon=True
    )
    child.start()
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, ready.get, True, CHILD_TIMEOUT)
        started = time.perf_counter()
        go.set()
        deadline = started + DRAIN_TIMEOUT
        while True:
            await asyncio.sleep(0.005)
            if not await connection.fetchval("SELECT EXISTS (SELECT 1 FROM pgqueuer)"):
                break
            if not child.is_alive():
                raise SystemExit(f"pgqueuer's worker process died ({child.exitcode})")
            if time.perf_counter() > deadline:
                raise SystemExit(f"pgqueuer: jobs left after {DRAIN_TIMEOUT:.0f} s")
        elapsed = time.perf_counter() - started
        stop.set()
        cpu = await loop.run_in_executor(None, results.get, True, CHILD_TIMEOUT)
    finally:
        stop.set()
        child.join(CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
    done = await connection.fetchval(
        "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    )
    if done != jobs:
        raise SystemExit(f"pgqueuer: {done} of {jobs} jobs logged successful")
    return jobs / elapsed, cpu / jobs


def parse_config(text: str) -> tuple[int, int]:
    managers, batch = text.lower().split("x")
    return int(managers), int(batch)


async def turn(options: argparse.Namespace) -> dict[str, Any]:
    name = f"pgqueuer_peer_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(options.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(options.url, name)
    try:
        connection = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(connection))
            await queries.install()
            # The checklist of its performance guide: `pgq autovac` after installing.
            await queries.optimize_autovacuum()
            result: dict[str, Any] = {
                "versions": {
                    "pgqueuer": pgqueuer_version,
                    "asyncpg": asyncpg.__version__,
                    "uvloop": uvloop.__version__,
                    "python": platform.python_version(),
                },
                "postgresql": await connection.fetchval("SHOW server_version"),
                "jobs": options.jobs,
                "worked": {},
            }
            say(f"single enqueue: {options.singles} jobs")
            result["single"] = await single(queries, options.singles)
            bulk = []
            for config in options.configs:
                managers, batch = parse_config(config)
                bulk.append(await fill(connection, queries, options.jobs, options.batch))
                rate, cpu = await drain(url, connection, options.jobs, managers, batch)
                say(f"{config}: {rate:,.0f} jobs/s, {cpu * 1e6:.0f} us CPU/job")
                result["worked"][config] = {"rate": rate, "cpu_us": cpu * 1e6}
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
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--singles", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--configs", nargs="+", default=["5x10"], help="MANAGERSxBATCH_SIZE")
    options = parser.parse_args()
    # A SIGTERM (bench/peers.py stopped) drops the database through the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(uvloop.run(turn(options))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
