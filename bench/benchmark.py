"""sa_jobs against the floor: the same work done by raw psycopg SQL with no library.

Not a test. It creates a throwaway database (``sa_jobs.devdb``), installs the schema with
``sa_jobs.migrate``, and measures each figure twice in the same run, on the same table
(same indexes, same insert trigger): once through sa_jobs, once through hand-written SQL
on a bare psycopg 3 connection. Each figure is printed with its ratio to the floor.

    python bench/benchmark.py            # the default run, a couple of minutes on 2 cores
    python bench/benchmark.py --quick    # smaller sizes, for a smoke test
    python bench/benchmark.py --only worked-1 --jobs 20000   # one measurement

What each floor is (see docs/performance.md for the reasoning):

* single insert: ``INSERT INTO sa_job (kind, args, queue) VALUES (...) RETURNING id`` and
  ``COMMIT`` per job on one psycopg connection (auto-prepared after five runs).
* bulk insert: ``INSERT ... SELECT FROM unnest(%s::text[], %s::jsonb[], %s::text[])
  RETURNING id``, one statement per 1,000 rows, one transaction each; ``COPY`` shown too.
* worked jobs: per process, one thread on one autocommit connection looping
  fetch (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
  RETURNING``) -> call a no-op for each job -> complete the batch (one ``UPDATE``), with
  ``n`` = the worker's concurrency, so both hold at most ``n`` jobs at a time.
* latency: a process that ``LISTEN``s on the channel sa_jobs' insert trigger notifies,
  and fetches (as above) on a second connection when a notification arrives.

Latency is measured from the moment the enqueuing transaction's ``COMMIT`` returned to
the first line of the handler, across processes on one host (``time.time()``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import URL, Engine, bindparam, create_engine, event, make_url, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database

QUEUE = "default"


@sa_jobs.job_args(kind="bench_noop")
class Noop:
    """The job every measurement uses: args ``{"seq": n}``, a handler that does nothing."""

    seq: int = 0


@sa_jobs.job_args(kind="bench_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class UniqueNoop:
    """The same job, unique by its args: measures what uniqueness costs an insert."""

    seq: int = 0


TTL = timedelta(hours=1)


@sa_jobs.job_args(kind="bench_unique_ttl", unique=sa_jobs.UniqueOpts(by_args=True, ttl=TTL))
class UniqueTtlNoop:
    """Unique with Faktory's TTL lock, which inserts release once it has expired."""

    seq: int = 0


def args_json(seq: int) -> str:
    return json.dumps({"seq": seq}, separators=(",", ":"))


# --------------------------------------------------------------------------- floor SQL

FLOOR_INSERT = "INSERT INTO sa_job (kind, args, queue) VALUES (%s, %s, %s) RETURNING id"

FLOOR_INSERT_UNNEST = (
    "INSERT INTO sa_job (kind, args, queue) "
    "SELECT * FROM unnest(%s::text[], %s::jsonb[], %s::text[]) RETURNING id"
)

FLOOR_COPY = "COPY sa_job (kind, args, queue) FROM STDIN"

# The same work as sa_jobs' fetch: lock due jobs in fetch-index order, mark them running.
FLOOR_FETCH = """
UPDATE sa_job
SET state = 'running', attempt = attempt + 1, attempted_at = now(),
    attempted_by = array_append(coalesce(attempted_by, '{}'::text[]), %(worker)s)
WHERE id IN (
    SELECT id FROM sa_job
    WHERE state = 'available' AND queue = %(queue)s AND scheduled_at <= now()
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, kind, args, attempt
"""

FLOOR_COMPLETE = """
UPDATE sa_job SET state = 'completed', finalized_at = now()
WHERE id = ANY(%s) AND state = 'running'
"""

# Cheap "is anything left?" through the two partial indexes (available, running).
NOT_DONE = text(
    "SELECT EXISTS (SELECT 1 FROM sa_job WHERE state = 'available')"
    " OR EXISTS (SELECT 1 FROM sa_job WHERE state = 'running')"
)


def conninfo(url: URL) -> str:
    return psycopg.conninfo.make_conninfo(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
    )


# --------------------------------------------------------------------------- results


class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        metric: str,
        ours: float,
        floor: float,
        unit: str,
        *,
        higher_is_better: bool = True,
        note: str = "",
    ) -> None:
        ratio = ours / floor if floor else float("nan")
        row = {
            "metric": metric,
            "sa_jobs": ours,
            "floor": floor,
            "unit": unit,
            "ratio": ratio,
            "higher_is_better": higher_is_better,
            "note": note,
        }
        self.rows.append(row)
        print(f"  {_format_row(row)}", flush=True)

    def render(self) -> str:
        lines = [_HEADER, "-" * len(_HEADER)]
        lines += [_format_row(row) for row in self.rows]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [
            "| metric | sa_jobs | floor (raw psycopg) | ratio to floor | note |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for row in self.rows:
            lines.append(
                f"| {row['metric']} | {_num(row['sa_jobs'])} {row['unit']} "
                f"| {_num(row['floor'])} {row['unit']} | {row['ratio']:.2f}x | {row['note']} |"
            )
        return "\n".join(lines)


_HEADER = f"{'metric':<44} {'sa_jobs':>12} {'floor':>12} {'unit':<8} {'ratio':>7}  note"


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['metric']:<44} {_num(row['sa_jobs']):>12} {_num(row['floor']):>12} "
        f"{row['unit']:<8} {row['ratio']:>6.2f}x  {row['note']}"
    )


# --------------------------------------------------------------------------- helpers


def reset(engine: Engine) -> None:
    """Empty the table and checkpoint, so every measurement starts from the same place."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("TRUNCATE sa_job RESTART IDENTITY"))
        connection.execute(text("CHECKPOINT"))


def preload(url: URL, engine: Engine, count: int) -> None:
    """Put ``count`` available no-op jobs in the table (COPY), analyze, checkpoint."""
    reset(engine)
    with psycopg.connect(conninfo(url)) as conn:
        with conn.cursor() as cur, cur.copy(FLOOR_COPY) as copy:
            for seq in range(count):
                copy.write_row(("bench_noop", args_json(seq), QUEUE))
        conn.commit()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
        connection.execute(text("CHECKPOINT"))


def completed_count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.scalar(text("SELECT count(*) FROM sa_job WHERE state = 'completed'")) or 0
        )


def loop_rate(count: int, one: Callable[[int], None]) -> float:
    """Warm up with 50 calls, then time ``count`` calls of ``one(seq)``."""
    for seq in range(-50, 0):
        one(seq)
    started = time.perf_counter()
    for seq in range(count):
        one(seq)
    return count / (time.perf_counter() - started)


class Quiet:
    """Waits (a bounded time) for other load on the machine to die down before a run.

    The figures are ratios to a floor measured minutes apart, so a neighbour's test run
    landing on one side only would skew them; every wait and every give-up is reported.
    """

    def __init__(
        self, enabled: bool, threshold: float = 0.25, limit: float = 15.0, budget: float = 120.0
    ) -> None:
        self.enabled = enabled
        self.threshold = threshold
        self.limit = limit
        self.budget = budget
        self.waited = 0.0
        self.gave_up = 0

    @staticmethod
    def busy(window: float = 0.5) -> float:
        """Fraction of all CPUs busy over ``window`` seconds (from /proc/stat)."""

        def sample() -> tuple[int, int]:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
            idle = fields[3] + fields[4]  # idle + iowait
            return idle, sum(fields)

        try:
            idle0, total0 = sample()
            time.sleep(window)
            idle1, total1 = sample()
        except OSError:
            return 0.0
        return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)

    def wait(self) -> None:
        if not self.enabled or self.waited >= self.budget:
            return
        started = time.monotonic()
        while (busy := self.busy()) > self.threshold:
            if time.monotonic() - started > self.limit or self.waited >= self.budget:
                self.gave_up += 1
                print(f"    (machine still {busy:.0%} busy after {self.limit:.0f} s; going on)")
                break
        self.waited += time.monotonic() - started


def interleaved(
    repeat: int,
    variants: dict[str, Callable[[], float]],
    before_each: Callable[[], None],
    quiet: Quiet,
) -> dict[str, float]:
    """Run every variant once per round, ``repeat`` rounds; keep each one's best rate.

    Interleaving puts the floor and sa_jobs under the same conditions in every round.
    """
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, measure in variants.items():
            before_each()
            quiet.wait()
            best[name] = max(best.get(name, 0.0), measure())
    return best


def paired(
    rounds: int,
    steps: int,
    variants: dict[str, Callable[[int], None]],
    before_each: Callable[[], None],
    quiet: Quiet,
) -> dict[str, float]:
    """Take turns step by step; return each variant's total seconds over all rounds.

    For a ratio between two ways of doing the same work. This VM's speed drifts by a
    third within a minute, so timing each variant in a block of its own decides the
    ratio by where the drift lands; taking turns step by step gives both the same
    machine. ``step(i)`` does the i-th unit of work (one insert, one batch).

    The order within each turn is shuffled (seeded, so runs are comparable): in a fixed
    order the garbage collector's full collections, which fire after a set number of
    allocations, fell on the same variant turn after turn and moved the bulk ratio by
    a tenth. Collections still happen and are paid for; they just land by chance.
    """
    spent = dict.fromkeys(variants, 0.0)
    order = list(variants.items())
    shuffler = random.Random(0x5A10B5)
    for _ in range(rounds):
        before_each()
        gc.collect()
        quiet.wait()
        for _name, step in order:
            step(-1)  # warm-up
        for i in range(steps):
            shuffler.shuffle(order)
            for name, step in order:
                started = time.perf_counter()
                step(i)
                spent[name] += time.perf_counter() - started
    return spent


#: The unique cases measured against plain inserts: (row label, args class, note, and
#: whether the table holds one TTL lock that has expired, which makes every unique insert
#: probe its keys for expired locks to release; see release_expired_locks).
UNIQUE_CASES: tuple[tuple[str, type, str, bool], ...] = (
    ("unique", UniqueNoop, "by args, no TTL", False),
    ("unique with ttl", UniqueTtlNoop, "TTL locks held, none expired", False),
    ("unique with ttl", UniqueTtlNoop, "an expired TTL lock in the table: keys probed", True),
)


def hold_an_expired_lock(engine: Engine) -> None:
    past = datetime.now(UTC) - 2 * TTL
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, UniqueTtlNoop(-(10**9)), scheduled_at=past)


def unique_cost(
    table: Table,
    label: str,
    engine: Engine,
    repeat: int,
    steps: int,
    jobs_per_step: int,
    quiet: Quiet,
    step_with: Callable[[type], Callable[[int], None]],
) -> None:
    """A 'unique vs plain' row per case, from paired runs (rates: jobs per second)."""

    for which, unique_class, note, expired_lock in UNIQUE_CASES:

        def before_each(expired_lock: bool = expired_lock) -> None:
            reset(engine)
            if expired_lock:
                hold_an_expired_lock(engine)

        spent = paired(
            repeat,
            steps,
            {"plain": step_with(Noop), "unique": step_with(unique_class)},
            before_each,
            quiet,
        )
        count = steps * jobs_per_step * repeat
        table.add(
            f"{label}: {which} vs plain (paired)",
            count / spent["unique"],
            count / spent["plain"],
            "/s",
            note=f"aim >= 0.77x (unique costs <= 1.3x); {note}",
        )


# --------------------------------------------------------------------------- inserts


def bench_single_insert(
    url: URL, engine: Engine, n: int, repeat: int, quiet: Quiet, table: Table
) -> None:
    print(f"single insert: {n} jobs, one transaction each (best of {repeat})", flush=True)
    reference = text(
        "INSERT INTO sa_job (kind, args, queue) VALUES (:kind, :args, :queue) RETURNING id"
    ).bindparams(bindparam("args", type_=JSONB))

    def floor() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(seq: int) -> None:
                conn.execute(FLOOR_INSERT, ("bench_noop", Jsonb({"seq": seq}), QUEUE)).fetchone()
                conn.commit()

            return loop_rate(n, one)

    def with_insert() -> float:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert(session, Noop(seq))

        return loop_rate(n, one)

    def with_enqueue() -> float:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                session.add(sa_jobs.enqueue(Noop(seq)))

        return loop_rate(n, one)

    def with_insert_job() -> float:
        def one(seq: int) -> None:
            with engine.begin() as connection:
                connection.execute(sa_jobs.insert_job(Noop(seq))).one()

        return loop_rate(n, one)

    def with_sqlalchemy_text() -> float:
        def one(seq: int) -> None:
            with engine.begin() as connection:
                params = {"kind": "bench_noop", "args": {"seq": seq}, "queue": QUEUE}
                connection.execute(reference, params).one()

        return loop_rate(n, one)

    rates = interleaved(
        repeat,
        {
            "floor": floor,
            "insert": with_insert,
            "enqueue": with_enqueue,
            "insert_job": with_insert_job,
            "text": with_sqlalchemy_text,
        },
        lambda: reset(engine),
        quiet,
    )
    floor_rate = rates["floor"]
    table.add("single insert/s: sa_jobs.insert(session)", rates["insert"], floor_rate, "/s")
    table.add("single insert/s: session.add(enqueue())", rates["enqueue"], floor_rate, "/s")
    table.add("single insert/s: conn.execute(insert_job())", rates["insert_job"], floor_rate, "/s")
    table.add(
        "single insert/s: SQLAlchemy text() INSERT",
        rates["text"],
        floor_rate,
        "/s",
        note="reference: SQLAlchemy alone, no sa_jobs code",
    )

    def single(args_class: type) -> Callable[[int], None]:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert(session, args_class(seq))

        return one

    unique_cost(table, "single insert/s", engine, repeat, n, 1, quiet, single)


@contextlib.contextmanager
def count_statements(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", before)


def bench_bulk_insert(
    url: URL, engine: Engine, batches: int, repeat: int, quiet: Quiet, table: Table
) -> None:
    size = 1000
    total = batches * size
    print(f"bulk insert: {batches} x {size} jobs, one transaction each (best of {repeat})")

    def batch_rate(one: Callable[[int], None]) -> float:
        one(-size)  # warm-up
        started = time.perf_counter()
        for batch in range(batches):
            one(batch * size)
        return total / (time.perf_counter() - started)

    def floor_unnest() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(base: int) -> None:
                seqs = range(base, base + size)
                kinds, queues = ["bench_noop"] * size, [QUEUE] * size
                args = [Jsonb({"seq": seq}) for seq in seqs]
                conn.execute(FLOOR_INSERT_UNNEST, (kinds, args, queues)).fetchall()
                conn.commit()

            return batch_rate(one)

    def floor_copy() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(base: int) -> None:
                with conn.cursor() as cur, cur.copy(FLOOR_COPY) as copy:
                    for seq in range(base, base + size):
                        copy.write_row(("bench_noop", args_json(seq), QUEUE))
                conn.commit()

            return batch_rate(one)

    def ours() -> float:
        def one(base: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert_many(session, [Noop(seq) for seq in range(base, base + size)])

        return batch_rate(one)

    rates = interleaved(
        repeat,
        {"unnest": floor_unnest, "copy": floor_copy, "ours": ours},
        lambda: reset(engine),
        quiet,
    )
    table.add(
        "bulk insert/s, 1,000/txn: insert_many",
        rates["ours"],
        rates["unnest"],
        "/s",
        note="floor: INSERT ... SELECT unnest() RETURNING id",
    )
    table.add(
        "bulk insert/s, 1,000/txn: insert_many",
        rates["ours"],
        rates["copy"],
        "/s",
        note="floor: COPY (returns no ids)",
    )

    def batch(args_class: type) -> Callable[[int], None]:
        def one(index: int) -> None:
            base = index * size
            with Session(engine) as session, session.begin():
                sa_jobs.insert_many(session, [args_class(seq) for seq in range(base, base + size)])

        return one

    unique_cost(table, "bulk insert/s, 1,000/txn", engine, repeat, batches, size, quiet, batch)
    with count_statements(engine) as statements, Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Noop(seq) for seq in range(size)])
    table.add(
        "statements per insert_many of 1,000",
        len(statements),
        1,
        "stmts",
        higher_is_better=False,
        note="BEGIN/COMMIT not counted",
    )


# --------------------------------------------------------------------------- worked jobs


def _child_setup() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(processName)s %(name)s: %(message)s")


def sa_jobs_worker_process(
    url_text: str,
    concurrency: int,
    ready: Any,
    go: MpEvent,
    stop: MpEvent,
    results: Any,
) -> None:
    """A worker process: one sa_jobs.Worker with a no-op sync handler."""
    _child_setup()
    engine = create_engine(make_url(url_text))
    worker = sa_jobs.Worker(engine, queues={QUEUE: concurrency})

    @worker.handler(Noop)
    def noop(job: sa_jobs.Job) -> None:
        pass

    with engine.connect() as connection:  # open the first pooled connection now
        connection.execute(text("SELECT 1"))
    ready.put(os.getpid())
    go.wait()
    cpu = os.times()
    worker.start()
    stop.wait()
    spent = os.times()
    worker.stop()
    results.put((spent.user - cpu.user) + (spent.system - cpu.system))
    engine.dispose()


def floor_worker_process(
    url_text: str,
    concurrency: int,
    ready: Any,
    go: MpEvent,
    stop: MpEvent,
    results: Any,
) -> None:
    """The floor: one thread, one autocommit connection, fetch -> run -> complete."""
    conn = psycopg.connect(conninfo(make_url(url_text)), autocommit=True)
    worker_id = f"floor-{os.getpid()}"
    params = {"worker": worker_id, "queue": QUEUE, "limit": concurrency}
    ready.put(os.getpid())
    go.wait()
    cpu = os.times()
    while not stop.is_set():
        rows = conn.execute(FLOOR_FETCH, params).fetchall()
        if not rows:
            stop.wait(0.005)
            continue
        for _id, _kind, _args, _attempt in rows:
            pass  # the no-op handler
        conn.execute(FLOOR_COMPLETE, ([row[0] for row in rows],))
    spent = os.times()
    results.put((spent.user - cpu.user) + (spent.system - cpu.system))
    conn.close()


def wait_ready(ready: Any, children: list[Any], timeout: float = 60.0) -> None:
    """Wait for every child to say it is ready; fail at once if one dies first."""
    deadline = time.monotonic() + timeout
    waiting = len(children)
    while waiting:
        try:
            ready.get(timeout=0.2)
            waiting -= 1
        except queue.Empty:
            dead = [child for child in children if child.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(
                    f"a benchmark process died (exit code {dead[0].exitcode})"
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"benchmark processes not ready after {timeout:.0f} s") from None


def drain(
    url: URL,
    engine: Engine,
    target: Callable[..., None],
    processes: int,
    concurrency: int,
    jobs: int,
) -> tuple[float, float]:
    """Run ``processes`` of ``target`` until the ``jobs`` preloaded jobs are all done.

    Returns (jobs/s, worker CPU seconds per job summed over the processes).
    """
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    children = [
        ctx.Process(
            target=target,
            args=(url.render_as_string(hide_password=False), concurrency, ready, go, stop, results),
            daemon=True,
        )
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    wait_ready(ready, children)
    with engine.connect() as connection:
        started = time.perf_counter()
        go.set()
        while True:
            time.sleep(0.005)
            if not connection.scalar(NOT_DONE):
                break
            connection.rollback()
        elapsed = time.perf_counter() - started
    stop.set()
    cpu = sum(results.get(timeout=60) for _ in children)
    for child in children:
        child.join(timeout=60)
    done = completed_count(engine)
    if done != jobs:
        raise RuntimeError(f"{target.__name__}: {done} of {jobs} jobs completed")
    return jobs / elapsed, cpu / jobs


def bench_worked(
    url: URL,
    engine: Engine,
    jobs: int,
    concurrency: int,
    process_counts: list[int],
    repeat: int,
    quiet: Quiet,
    table: Table,
) -> None:
    for processes in process_counts:
        print(
            f"worked no-op jobs: {jobs} jobs, {processes} process(es) x concurrency "
            f"{concurrency} (best of {repeat})",
            flush=True,
        )
        results: dict[str, tuple[float, float]] = {}
        for _ in range(repeat):
            for name, target in (
                ("floor", floor_worker_process),
                ("ours", sa_jobs_worker_process),
            ):
                preload(url, engine, jobs)
                quiet.wait()
                rate, cpu = drain(url, engine, target, processes, concurrency, jobs)
                if name not in results or rate > results[name][0]:
                    results[name] = (rate, cpu)
        (our_rate, our_cpu), (floor_rate, floor_cpu) = results["ours"], results["floor"]
        label = "1 process" if processes == 1 else f"{processes} processes"
        table.add(f"worked no-op jobs/s, {label}", our_rate, floor_rate, "/s", note="aim >= 0.50x")
        table.add(
            f"worker CPU per job, {label}",
            our_cpu * 1e6,
            floor_cpu * 1e6,
            "us",
            higher_is_better=False,
            note="user+sys of the worker processes",
        )


# --------------------------------------------------------------------------- latency


def sa_jobs_latency_process(url_text: str, ready: Any, stop: MpEvent, starts: Any) -> None:
    _child_setup()
    engine = create_engine(make_url(url_text))
    worker = sa_jobs.Worker(engine, queues={QUEUE: 10})

    @worker.handler(Noop)
    def record(job: sa_jobs.Job) -> None:
        starts.put((job.args.seq, time.time()))

    worker.start()
    time.sleep(1.0)  # let the listener connect and the first fetch happen
    ready.put(os.getpid())
    stop.wait()
    worker.stop()
    engine.dispose()


def floor_latency_process(url_text: str, ready: Any, stop: MpEvent, starts: Any) -> None:
    info = conninfo(make_url(url_text))
    listen = psycopg.connect(info, autocommit=True)
    work = psycopg.connect(info, autocommit=True)
    listen.execute("LISTEN sa_jobs_insert")
    params = {"worker": f"floor-{os.getpid()}", "queue": QUEUE, "limit": 10}
    work.execute(FLOOR_FETCH, params).fetchall()  # prepare and warm up
    ready.put(os.getpid())
    while not stop.is_set():
        for _notification in listen.notifies(timeout=0.25):
            rows = work.execute(FLOOR_FETCH, params).fetchall()
            for _id, _kind, args, _attempt in rows:
                starts.put((args["seq"], time.time()))
            if rows:
                work.execute(FLOOR_COMPLETE, ([row[0] for row in rows],))
            if stop.is_set():
                break
    listen.close()
    work.close()


def latencies(
    url: URL,
    engine: Engine,
    target: Callable[..., None],
    enqueue: Callable[[int], float],
    samples: int,
) -> list[float]:
    reset(engine)
    ctx = mp.get_context("spawn")
    ready, starts = ctx.Queue(), ctx.Queue()
    stop = ctx.Event()
    child = ctx.Process(
        target=target,
        args=(url.render_as_string(hide_password=False), ready, stop, starts),
        daemon=True,
    )
    child.start()
    wait_ready(ready, [child])
    rng = random.Random(1)
    result = []
    for seq in range(-20, samples):  # the first 20 warm up
        committed = enqueue(seq)
        got_seq, started = starts.get(timeout=30)
        if got_seq != seq:
            raise RuntimeError(f"expected job {seq} to start, got {got_seq}")
        if seq >= 0:
            result.append(started - committed)
        time.sleep(rng.uniform(0.002, 0.010))  # the worker is idle again
    stop.set()
    child.join(timeout=60)
    return result


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def bench_latency(url: URL, engine: Engine, samples: int, quiet: Quiet, table: Table) -> None:
    print(f"enqueue -> start latency: {samples} jobs, one at a time, worker idle", flush=True)
    with psycopg.connect(conninfo(url)) as conn:

        def floor_enqueue(seq: int) -> float:
            conn.execute(FLOOR_INSERT, ("bench_noop", Jsonb({"seq": seq}), QUEUE)).fetchone()
            conn.commit()
            return time.time()

        quiet.wait()
        floor = latencies(url, engine, floor_latency_process, floor_enqueue, samples)

    def our_enqueue(seq: int) -> float:
        session = Session(engine)
        try:
            sa_jobs.insert(session, Noop(seq))
            session.commit()
            return time.time()
        finally:
            session.close()

    quiet.wait()
    ours = latencies(url, engine, sa_jobs_latency_process, our_enqueue, samples)
    for q in (50, 99):
        table.add(
            f"enqueue->start latency p{q}",
            percentile(ours, q) * 1e3,
            percentile(floor, q) * 1e3,
            "ms",
            higher_is_better=False,
            note="aim p50 <= 5 ms" if q == 50 else "",
        )


# --------------------------------------------------------------------------- main


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    root = Path(sa_jobs.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "not a git checkout"
    return {
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "memory": memory,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sa_jobs": f"{Path(sa_jobs.__file__).parent} (git {commit})",
        "psycopg": psycopg.__version__,
        "sqlalchemy": __import__("sqlalchemy").__version__,
    }


MEASUREMENTS = ("single", "bulk", "worked-1", "worked-n", "latency")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--jobs", type=int, help="jobs drained per worked measurement")
    parser.add_argument("--singles", type=int, help="jobs per single-insert measurement")
    parser.add_argument("--batches", type=int, help="batches of 1,000 per bulk measurement")
    parser.add_argument("--samples", type=int, help="latency samples")
    parser.add_argument("--concurrency", type=int, default=10, help="worker concurrency")
    parser.add_argument(
        "--processes", default="2,4", help="process counts for worked-n (comma separated)"
    )
    parser.add_argument("--repeat", type=int, help="insert measurements: best of N rounds")
    parser.add_argument(
        "--worked-repeat", type=int, default=1, help="worked measurements: best of N rounds"
    )
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="do not wait for other load on the machine to die down before each run",
    )
    parser.add_argument(
        "--only", action="append", choices=MEASUREMENTS, help="run only these (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    quick = args.quick
    args.jobs = args.jobs or (3_000 if quick else 20_000)
    args.singles = args.singles or (300 if quick else 2_000)
    args.batches = args.batches or (3 if quick else 20)
    args.samples = args.samples or (50 if quick else 300)
    args.repeat = args.repeat or (1 if quick else 3)
    args.only = args.only or list(MEASUREMENTS)
    return args


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    info = machine()
    info["load average at start"] = load_average()
    for key, value in info.items():
        print(f"{key:>22}: {value}")
    table = Table()
    quiet = Quiet(args.wait)
    server = find_server()
    print(f"{'server':>22}: {server.source}")
    started = time.perf_counter()
    try:
        with throwaway_database(server, prefix="sa_jobs_bench") as url:
            engine = create_engine(url, pool_size=10, max_overflow=10)
            sa_jobs.migrate(engine)
            with engine.connect() as connection:
                info["postgresql"] = str(connection.scalar(text("SHOW server_version")))
            print(f"{'postgresql':>22}: {info['postgresql']}", flush=True)
            if "single" in args.only:
                bench_single_insert(url, engine, args.singles, args.repeat, quiet, table)
            if "bulk" in args.only:
                bench_bulk_insert(url, engine, args.batches, args.repeat, quiet, table)
            counts = []
            if "worked-1" in args.only:
                counts.append(1)
            if "worked-n" in args.only:
                counts += [int(p) for p in args.processes.split(",") if p.strip()]
            if counts:
                bench_worked(
                    url,
                    engine,
                    args.jobs,
                    args.concurrency,
                    counts,
                    args.worked_repeat,
                    quiet,
                    table,
                )
            if "latency" in args.only:
                bench_latency(url, engine, args.samples, quiet, table)
            engine.dispose()
    finally:
        server.stop()
    info["load average at end"] = load_average()
    info["seconds waited for a quiet machine"] = f"{quiet.waited:.0f} (gave up {quiet.gave_up}x)"
    print()
    print(table.render())
    print(f"\nratio = sa_jobs / floor; total {time.perf_counter() - started:.0f} s")
    print(f"load average at end: {info['load average at end']}")
    print(f"seconds waited for a quiet machine: {info['seconds waited for a quiet machine']}")
    if args.json:
        document: dict[str, Any] = {"machine": info, "args": vars(args) | {"json": str(args.json)}}
        document["rows"] = table.rows
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
