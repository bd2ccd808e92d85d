"""sa_jobs' side of the benchmark: the no-op job, its handlers, and the worker processes.

Each process is started fresh (``spawn``), builds its own engine and
:class:`sa_jobs.Worker` through the public API, and reports back over
``multiprocessing`` queues, so what is measured is what an application's worker
process does.
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import threading
import time
from multiprocessing.synchronize import Event
from typing import Any, Literal

from sqlalchemy import create_engine, make_url, text

import sa_jobs
from sa_jobs.benchmark import dbcost

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
    url: str,
    queues: dict[str, int],
    handler: Handler,
    starts: Any = None,
    limits: tuple[tuple[str, int], ...] = (),
) -> sa_jobs.Worker:
    """A worker with one no-op handler (sync or async). With ``starts``, the handler
    puts ``(seq, time.time())`` there on its first line instead. ``limits``: a
    ``ConcurrencyLimit`` per (queue, max_running) pair."""
    logging.basicConfig(level=logging.WARNING, format="%(processName)s %(name)s: %(message)s")
    engine = create_engine(make_url(url))
    worker = sa_jobs.Worker(
        engine,
        queues=queues,
        limits=[sa_jobs.ConcurrencyLimit(most, queue=queue) for queue, most in limits],
    )

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
    *,
    limits: tuple[tuple[str, int], ...] = (),
) -> None:
    """A worker process: starts working at ``go``, stops at ``stop``; ``limits`` as
    :func:`_worker` takes them (the process is spawned: they must pickle).

    Puts its user+system CPU seconds from ``go`` to ``stop`` (every thread of the process:
    producers, handlers, completer, notifier, maintenance), and the statements and round
    trips it sent meanwhile (:func:`dbcost.client_counter`), on ``results``.
    """
    worker = _worker(url, queues, handler, limits=limits)
    sent = dbcost.client_counter()
    profiles = _profile_threads()
    ready.put(os.getpid())
    go.wait()
    # process_time: user+sys of every thread, to the nanosecond (os.times() counts
    # clock ticks, 10 ms, which a short run of a lean loop can fall entirely within).
    before, counted = time.process_time(), sent()
    worker.start()
    stop.wait()
    after, delta = time.process_time(), sent() - counted
    worker.stop()
    results.put((after - before, delta.statements, delta.round_trips))
    worker.engine.dispose()
    if profiles is not None:
        _dump_profiles(profiles)


#: A path for the worker process's cProfile output (every thread's, merged), for
#: bench/concurrency_curve.py --profile; the process runs unprofiled without it.
PROFILE_VARIABLE = "SA_JOBS_BENCH_PROFILE"
#: ``cpu`` to time each thread's CPU (``time.thread_time``) rather than the wall clock:
#: with hundreds of threads, a wall-clock profile charges a function for the time its
#: thread waited for the GIL or a lock, which is not what a CPU-bound worker spends.
PROFILE_CLOCK_VARIABLE = "SA_JOBS_BENCH_PROFILE_CLOCK"


def _profile_threads() -> list[cProfile.Profile] | None:
    """Profile every thread started from now on (cProfile sees only its own thread)."""
    if not os.environ.get(PROFILE_VARIABLE):
        return None
    profiles: list[cProfile.Profile] = []
    cpu = os.environ.get(PROFILE_CLOCK_VARIABLE) == "cpu"

    def start(*_: Any) -> None:
        # Called by a new thread's first profile event: hand it a profiler of its own,
        # which replaces this function as the thread's profile hook.
        profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start)
    return profiles


def _dump_profiles(profiles: list[cProfile.Profile]) -> None:
    for profile in profiles:
        profile.disable()
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    stats.dump_stats(os.environ[PROFILE_VARIABLE])


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
