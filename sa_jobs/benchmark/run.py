"""One benchmark run on a throwaway database: enqueue, drain, latency; the floor alongside.

The order is fixed, so runs compare: single enqueues (sa_jobs and the floor taking turns
job by job), then for each side its bulk enqueue of the jobs it then drains, then
latency, then the cost of the insert-time args check against those enqueues. Every
phase starts from an empty table (``TRUNCATE``) and a checkpoint, so no phase inherits
another's dead rows or dirty pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._base.urls import in_driver
from sa_jobs.benchmark import (
    args_cost,
    best_worked,
    children,
    dbcost,
    fair_fetch,
    floor,
    limits_drain,
    noop,
    workflows,
)
from sa_jobs.benchmark.report import Figure, Report, environment
from sa_jobs.devdb import Server, throwaway_database

__all__ = ["PHASES", "BenchSettings", "batches", "run"]

#: The parts of a run, in the order they run (``BenchSettings.phases`` picks some):
#: single enqueues, bulk enqueues and the drain, latency, the fair and key-limited
#: fetches, the drains under limits, and the workflows against plain jobs. The args
#: check's cost needs the first two.
PHASES = ("single", "worked", "latency", "fetch", "limits", "workflows")

Say = Callable[[str], None]

#: Single enqueues each side makes, untimed, before the timed ones.
SINGLE_WARM_UP = 20


@attrs.frozen
class BenchSettings:
    """What to measure, and how much of it.

    Attributes:
        jobs: Jobs enqueued in bulk and then drained (per side).
        singles: Jobs enqueued one transaction each (per side).
        samples: Latency samples (per side), after 20 thrown away.
        queues: Queue name to concurrency, per worker process; jobs are spread evenly
            over the queues.
        processes: Worker processes draining the jobs (latency always uses one).
        handler: The no-op handler is a plain function or an ``async def``.
        floor: Also measure the raw-SQL floor and give each figure's ratio to it.
        floor_threads: Also drain with the workplace's floor, this many threads in one
            process fetching 100 jobs a statement, against sa_jobs' best rate in one
            process (:mod:`sa_jobs.benchmark.best_worked`); 0: not.
        batch: Jobs per bulk enqueue transaction.
        phases: Which of :data:`PHASES` to run (all by default).
    """

    jobs: int = 10_000
    singles: int = 1_000
    samples: int = 300
    queues: dict[str, int] = attrs.field(factory=lambda: {"default": 10})
    processes: int = 1
    handler: noop.Handler = "sync"
    floor: bool = False
    floor_threads: int = 0
    batch: int = 1_000
    phases: tuple[str, ...] = PHASES

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def run(server: Server, settings: BenchSettings, say: Say) -> Report:
    """Measure on a throwaway database on ``server`` (created here, dropped at the end)."""
    report = Report(settings.as_dict(), environment())
    report.environment["server"] = server.source
    with throwaway_database(server, prefix="sa_jobs_bench") as url:
        report.environment["database"] = str(url.database)
        engine = create_engine(url, pool_size=5)
        try:
            sa_jobs.migrate(engine)
            with engine.connect() as connection:
                version = connection.scalar(text("SHOW server_version"))
            report.environment["postgresql"] = str(version)
            _measure(url, engine, settings, report, say)
        finally:
            engine.dispose()
    return report


def _measure(url: URL, engine: Engine, settings: BenchSettings, report: Report, say: Say) -> None:
    inserter = floor.FloorInserter(url, noop.KIND) if settings.floor else None
    phases = settings.phases
    try:
        if "single" in phases:
            report.figures += _single_phase(url, engine, inserter, settings, say)
        if "worked" in phases:
            report.figures += _worked_phase(url, engine, inserter, settings, say)
            if settings.floor_threads:
                report.figures += best_worked.figures(
                    url,
                    engine,
                    settings.floor_threads,
                    settings.jobs,
                    list(settings.queues),
                    settings.handler,
                    lambda: _fill(engine, settings),
                    say,
                )
        if "latency" in phases:
            report.figures += _latency_phase(url, engine, inserter, settings, say)
        rates = {figure.key: figure.sa_jobs for figure in report.figures}
        if "enqueue_single" in rates and "enqueue_bulk" in rates:
            say("args check: timed alone, against this run's enqueues")
            report.figures += args_cost.figures(rates["enqueue_single"], rates["enqueue_bulk"])
        if "fetch" in phases:
            report.figures += fair_fetch.figures(engine, settings.jobs, say)
        if "limits" in phases:
            report.figures += _limits_phase(url, engine, settings, say)
        if "workflows" in phases:
            report.figures += workflows.figures(engine, settings.jobs, say)
    finally:
        if inserter is not None:
            inserter.close()


def _single_phase(
    url: URL,
    engine: Engine,
    inserter: floor.FloorInserter | None,
    settings: BenchSettings,
    say: Say,
) -> list[Figure]:
    say(f"single enqueue: {settings.singles:,} jobs, one transaction each")
    reset(engine)
    queue = next(iter(settings.queues))
    rates = asyncio.run(_single_enqueue(url, engine, inserter, settings.singles, queue))
    theirs = rates.get("floor")
    return [
        Figure(
            "enqueue_single",
            "enqueue, single (add(enqueue()) + commit)",
            "jobs/s",
            rates["sync"],
            theirs,
        ),
        Figure(
            "enqueue_single_async",
            "enqueue, single (await insert(AsyncSession) + commit)",
            "jobs/s",
            rates["async"],
            theirs,
        ),
        # Against the plain single enqueue above (same turns), not the floor.
        Figure(
            "enqueue_single_unique",
            "enqueue, single, unique by args (add(enqueue()) + commit)",
            "jobs/s",
            rates["unique"],
        ),
    ]


def _worked_phase(
    url: URL,
    engine: Engine,
    inserter: floor.FloorInserter | None,
    settings: BenchSettings,
    say: Say,
) -> list[Figure]:
    """Each side enqueues the jobs in bulk, then drains them: the floor first."""
    chunks = batches(settings.jobs, list(settings.queues), settings.batch)
    theirs_bulk = theirs = None
    workers = "1 process" if settings.processes == 1 else f"{settings.processes} processes"
    size = max(len(seqs) for _, seqs in chunks)
    if inserter is not None:
        say(f"floor: bulk enqueue of {settings.jobs:,} jobs, then drain with {workers}")
        theirs_bulk = _bulk(engine, chunks, inserter.bulk)
        theirs = _drain(url, engine, floor.floor_worker_process, settings)
    say(f"sa_jobs: bulk enqueue of {settings.jobs:,} unique jobs (not drained)")
    unique_bulk = _bulk(
        engine, chunks, lambda seqs, queue: _insert_many(engine, seqs, queue, unique=True)
    )
    say(f"sa_jobs: bulk enqueue of {settings.jobs:,} jobs through COPY (not drained)")
    fast_bulk = _bulk(
        engine, chunks, lambda seqs, queue: _insert_many(engine, seqs, queue, fast=True)
    )
    say(f"sa_jobs: bulk enqueue of {settings.jobs:,} jobs, then drain with {workers}")
    ours_bulk = _bulk(engine, chunks, lambda seqs, queue: _insert_many(engine, seqs, queue))
    ours = _drain(url, engine, noop.worker_process, settings)
    if ours.server is not None and ours.server.backend_cpu is None:
        say("server CPU per job: not measured (the server is not a process on this host)")
    slots = ", ".join(f"{name}={n}" for name, n in settings.queues.items())
    return [
        Figure(
            "enqueue_bulk",
            f"enqueue, bulk (insert_many, {size:,}/txn)",
            "jobs/s",
            ours_bulk,
            theirs_bulk,
        ),
        Figure(
            "enqueue_bulk_fast",
            f"enqueue, bulk (insert_many_fast, COPY, {size:,}/txn)",
            "jobs/s",
            fast_bulk,
            theirs_bulk,
        ),
        # Against the plain bulk enqueue above, not the floor.
        Figure(
            "enqueue_bulk_unique",
            f"enqueue, bulk, unique by args (insert_many, {size:,}/txn)",
            "jobs/s",
            unique_bulk,
        ),
        Figure(
            "worked",
            f"worked no-op jobs, {workers}, {settings.handler} handler",
            "jobs/s",
            ours.rate,
            None if theirs is None else theirs.rate,
        ),
        Figure(
            "worker_cpu_per_job",
            "worker CPU per job (user+sys)",
            "us",
            ours.per_job(ours.cpu) * 1e6,
            None if theirs is None else theirs.per_job(theirs.cpu) * 1e6,
            higher_is_better=False,
        ),
        *dbcost.cost_figures("db_", f"{workers}, {slots}", ours, theirs),
    ]


def _latency_phase(
    url: URL,
    engine: Engine,
    inserter: floor.FloorInserter | None,
    settings: BenchSettings,
    say: Say,
) -> list[Figure]:
    say(f"latency: {settings.samples:,} jobs one at a time, idle worker (1 process)")
    queue = next(iter(settings.queues))
    theirs: list[float] | None = None
    if inserter is not None:
        reset(engine)
        theirs = children.latencies(
            url,
            floor.floor_latency_process,
            settings.queues,
            settings.handler,
            lambda seq: inserter.single(seq, queue),
            settings.samples,
        )
    reset(engine)
    ours = children.latencies(
        url,
        noop.latency_process,
        settings.queues,
        settings.handler,
        lambda seq: _enqueue(engine, seq, queue),
        settings.samples,
    )
    return [
        Figure(
            f"latency_p{q}",
            f"latency enqueue->handler start, p{q}",
            "ms",
            children.percentile(ours, q) * 1e3,
            None if theirs is None else children.percentile(theirs, q) * 1e3,
            higher_is_better=False,
        )
        for q in (50, 90, 99)
    ]


def _limits_phase(url: URL, engine: Engine, settings: BenchSettings, say: Say) -> list[Figure]:
    """Drains under no limit, a limit on another queue, and a loose limit on the queue."""

    def fill(jobs: int, queue: str) -> None:
        _fill(engine, settings, jobs, [queue])

    def drain(
        target: Callable[..., None], queues: dict[str, int], jobs: int
    ) -> tuple[float, float]:
        return children.drain(
            url, engine, target, settings.processes, queues, settings.handler, jobs
        )

    return limits_drain.figures(
        url, engine, settings.queues, settings.jobs, fill=fill, drain=drain, say=say
    )


def batches(jobs: int, queues: list[str], size: int) -> list[tuple[str, range]]:
    """The bulk enqueue's transactions: ``jobs`` numbered jobs spread evenly over
    ``queues`` (contiguous runs), each run cut into batches of at most ``size``."""
    result: list[tuple[str, range]] = []
    start = 0
    for index, queue in enumerate(queues):
        share = jobs // len(queues) + (1 if index < jobs % len(queues) else 0)
        for low in range(start, start + share, size):
            result.append((queue, range(low, min(low + size, start + share))))
        start += share
    return result


def _fill(
    engine: Engine, settings: BenchSettings, jobs: int = 0, queues: list[str] | None = None
) -> None:
    """An empty table filled with ``jobs`` (default ``settings.jobs``) no-op jobs through
    COPY, spread over ``queues`` (default ``settings.queues``), vacuumed, analyzed."""
    reset(engine)
    for queue, seqs in batches(
        jobs or settings.jobs, queues or list(settings.queues), settings.batch
    ):
        _insert_many(engine, seqs, queue, fast=True)
    with _autocommit(engine) as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
    _checkpoint(engine)


# ---------------------------------------------------------------------- measurements


def _enqueue(engine: Engine, seq: int, queue: str, *, unique: bool = False) -> float:
    """sa_jobs' single enqueue: the ORM path, one transaction; ``time.time()`` after the
    commit returned."""
    make = noop.BenchUniqueNoop if unique else noop.BenchNoop
    with Session(engine) as session:
        session.add(sa_jobs.enqueue(make(seq), queue=queue))
        session.commit()
    return time.time()


def _insert_many(
    engine: Engine, seqs: range, queue: str, *, unique: bool = False, fast: bool = False
) -> None:
    make = noop.BenchUniqueNoop if unique else noop.BenchNoop
    insert = sa_jobs.insert_many_fast if fast else sa_jobs.insert_many
    with Session(engine) as session, session.begin():
        insert(session, [make(seq) for seq in seqs], queue=queue)


async def _single_enqueue(
    url: URL, engine: Engine, inserter: floor.FloorInserter | None, count: int, queue: str
) -> dict[str, float]:
    """Jobs per second of each single enqueue: ``sync`` (``session.add(enqueue())``),
    ``async`` (``await insert(async_session)``), ``unique`` (the sync one with a job
    unique by its args) and the ``floor``'s, taking turns job by job.

    Taking turns gives every side the same machine: this kind of VM drifts by a third
    within a minute, which would decide the ratio if each side ran in a block of its
    own. The order within each turn is shuffled (seeded), so the garbage collector's
    full collections do not keep landing on the same side. Everything runs on one event
    loop, as an async application's enqueues do; the sync ones simply block it.
    """
    async_engine = create_async_engine(in_driver(url, "psycopg_async"), pool_size=5)

    async def sync_step(seq: int) -> None:
        _enqueue(engine, seq, queue)

    async def unique_step(seq: int) -> None:
        _enqueue(engine, seq, queue, unique=True)

    async def async_step(seq: int) -> None:
        async with AsyncSession(async_engine) as session:
            await sa_jobs.insert(session, noop.BenchNoop(seq), queue=queue)
            await session.commit()

    steps: dict[str, Callable[[int], Awaitable[None]]] = {
        "sync": sync_step,
        "async": async_step,
        "unique": unique_step,
    }
    if inserter is not None:

        async def floor_step(seq: int) -> None:
            inserter.single(seq, queue)

        steps["floor"] = floor_step
    try:
        for seq in range(-SINGLE_WARM_UP, 0):
            for step in steps.values():
                await step(seq)
        spent = dict.fromkeys(steps, 0.0)
        order = list(steps.items())
        shuffler = random.Random(0x5A10B5)
        gc.collect()
        for seq in range(count):
            shuffler.shuffle(order)
            for name, step in order:
                started = time.perf_counter()
                await step(seq)
                spent[name] += time.perf_counter() - started
    finally:
        await async_engine.dispose()
    return {name: count / seconds for name, seconds in spent.items()}


def _bulk(
    engine: Engine, chunks: list[tuple[str, range]], insert: Callable[[range, str], None]
) -> float:
    """Rate of enqueueing ``chunks`` (one transaction each) into an empty table, after
    one untimed batch; leaves the jobs in place, vacuumed and analyzed."""
    reset(engine)
    queue, first = chunks[0]
    insert(range(-len(first), 0), queue)  # warm up: connections, statement caches
    reset(engine)
    gc.collect()
    started = time.perf_counter()
    for queue, seqs in chunks:
        insert(seqs, queue)
    elapsed = time.perf_counter() - started
    with _autocommit(engine) as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
    _checkpoint(engine)
    return sum(len(seqs) for _, seqs in chunks) / elapsed


def _drain(
    url: URL, engine: Engine, target: Callable[..., None], settings: BenchSettings
) -> dbcost.Drained:
    return children.drain_costs(
        url,
        engine,
        target,
        settings.processes,
        settings.queues,
        settings.handler,
        settings.jobs,
        probe=True,
    )


# ---------------------------------------------------------------------- the table


@contextlib.contextmanager
def _autocommit(engine: Engine) -> Iterator[Any]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        yield connection


def reset(engine: Engine) -> None:
    """Empty the job table and checkpoint, so every phase starts from the same place."""
    with _autocommit(engine) as connection:
        connection.execute(text("TRUNCATE sa_job RESTART IDENTITY"))
    _checkpoint(engine)


def _checkpoint(engine: Engine) -> None:
    """Write dirty pages out now rather than during the next measurement.

    Best effort: ``CHECKPOINT`` needs a superuser (or ``pg_checkpoint``), which the
    benchmark does not otherwise need.
    """
    with contextlib.suppress(DBAPIError), _autocommit(engine) as connection:
        connection.execute(text("CHECKPOINT"))
