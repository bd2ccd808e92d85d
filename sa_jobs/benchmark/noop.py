"""sa_jobs' side of the benchmark: the no-op job, its handlers, and the worker processes.

Each process is started fresh (``spawn``), builds its own engine and
:class:`sa_jobs.Worker` through the public API, and reports back over
``multiprocessing`` queues, so what is measured is what an application's worker
process does.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing.synchronize import Event
from typing import Any, Literal

from sqlalchemy import create_engine, make_url, text

import sa_jobs

__all__ = [
    "KIND",
    "BenchNoop",
    "BenchUniqueNoop",
    "Handler",
    "latency_process",
    "worker_process",
]

KIND = "sa_jobs_bench_noop"

#: Which kind of no-op handler the worker runs.
Handler = Literal["sync", "async"]


@sa_jobs.job_args(kind=KIND)
class BenchNoop:
    """The job every measurement uses: args ``{"seq": n}``; its handler does nothing."""

    seq: int = 0


@sa_jobs.job_args(kind="sa_jobs_bench_unique_noop", unique=sa_jobs.UniqueOpts(by_args=True))
class BenchUniqueNoop:
    """The same job, unique by its args: each insert computes a key and goes through
    ``ON CONFLICT`` against the unique index (issue 15 keeps its cost within 1.3x)."""

    seq: int = 0


def _worker(
    url: str, queues: dict[str, int], handler: Handler, starts: Any = None
) -> sa_jobs.Worker:
    """A worker with one no-op handler (sync or async). With ``starts``, the handler
    puts ``(seq, time.time())`` there on its first line instead."""
    logging.basicConfig(level=logging.WARNING, format="%(processName)s %(name)s: %(message)s")
    engine = create_engine(make_url(url))
    worker = sa_jobs.Worker(engine, queues=queues)

    if handler == "async":

        @worker.handler(BenchNoop)
        async def noop_async(job: sa_jobs.Job[BenchNoop]) -> None:
            if starts is not None:
                starts.put((job.args.seq, time.time()))

    else:

        @worker.handler(BenchNoop)
        def noop(job: sa_jobs.Job[BenchNoop]) -> None:
            if starts is not None:
                starts.put((job.args.seq, time.time()))

    with engine.connect() as connection:  # open the first pooled connection now
        connection.execute(text("SELECT 1"))
    return worker


def worker_process(
    url: str,
    queues: dict[str, int],
    handler: Handler,
    ready: Any,
    go: Event,
    stop: Event,
    results: Any,
) -> None:
    """A worker process: starts working at ``go``, stops at ``stop``.

    Puts its user+system CPU seconds from ``go`` to ``stop`` on ``results`` (every thread
    of the process: producers, handlers, completer, notifier, maintenance).
    """
    worker = _worker(url, queues, handler)
    ready.put(os.getpid())
    go.wait()
    # process_time: user+sys of every thread, to the nanosecond (os.times() counts
    # clock ticks, 10 ms, which a short run of a lean loop can fall entirely within).
    before = time.process_time()
    worker.start()
    stop.wait()
    after = time.process_time()
    worker.stop()
    results.put(after - before)
    worker.engine.dispose()


def latency_process(
    url: str, queues: dict[str, int], handler: Handler, ready: Any, stop: Event, starts: Any
) -> None:
    """An idle worker whose handler reports when it starts; ready once it listens."""
    worker = _worker(url, queues, handler, starts)
    worker.start()
    worker.listening.wait(30)
    time.sleep(0.3)  # let the first fetch (of nothing) pass
    ready.put(os.getpid())
    stop.wait()
    worker.stop()
    worker.engine.dispose()
