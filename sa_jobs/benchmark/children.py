"""Measurements that need worker processes: draining jobs, and enqueue → start latency.

The same two procedures run sa_jobs' worker processes and the floor's
(:mod:`sa_jobs.benchmark.noop`, :mod:`sa_jobs.benchmark.floor`): the process targets
share one signature, so both sides are started, released and timed the same way.
Processes are *spawned* (a fresh interpreter each), so nothing of the parent — its
engine, threads or imports — leaks into what a worker process costs.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import random
import signal
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import URL, Engine, text

from sa_jobs.benchmark.dbcost import ClientCounts, Drained, ServerProbe
from sa_jobs.errors import BenchmarkError

__all__ = ["drain", "drain_costs", "latencies", "percentile"]

#: Cheap "is anything left?" through the two partial indexes (available, running).
NOT_DONE = text(
    "SELECT EXISTS (SELECT 1 FROM sa_job WHERE state = 'available')"
    " OR EXISTS (SELECT 1 FROM sa_job WHERE state = 'running')"
)
COMPLETED = text("SELECT count(*) FROM sa_job WHERE state = 'completed'")

#: Latency samples taken and thrown away first (connections, prepared statements).
WARM_UP = 20
#: Seconds any child may take to get ready, and to report at the end.
CHILD_TIMEOUT = 60.0


def _child(target: Callable[..., None], *args: Any) -> None:
    """Run ``target`` in a spawned process, deaf to SIGINT: a Ctrl-C at the terminal
    reaches the whole process group, and the parent, not the child, decides how to stop
    (it sets the stop event, waits, and drops the database)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    target(*args)


def _url_text(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def _wait_ready(ready: Any, children: list[Any]) -> None:
    """Wait for every child to say it is ready; fail at once if one dies first."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    waiting = len(children)
    while waiting:
        try:
            ready.get(timeout=0.2)
            waiting -= 1
        except queue.Empty:
            _check_alive(children)
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"the benchmark's worker processes were not ready after {CHILD_TIMEOUT:.0f} s"
                ) from None


def _check_alive(children: list[Any]) -> None:
    dead = [child for child in children if child.exitcode is not None]
    if dead:
        raise BenchmarkError(
            f"a benchmark worker process died (exit code {dead[0].exitcode}); "
            "its error is printed above"
        )


def _result(results: Any, children: list[Any]) -> tuple[float, ClientCounts]:
    """One child's CPU seconds and what it sent (``(cpu, statements, round_trips)`` on
    ``results``); a child that died instead of reporting is an error."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        try:
            cpu, statements, round_trips = results.get(timeout=0.2)
            return float(cpu), ClientCounts(int(statements), int(round_trips))
        except queue.Empty:
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"a benchmark worker process did not stop within {CHILD_TIMEOUT:.0f} s"
                ) from None
            # A child that exited 0 may have put its figure just now: look once more.
            if any(child.exitcode not in (None, 0) for child in children):
                _check_alive(children)


def _stop_all(children: list[Any]) -> None:
    for child in children:
        child.join(timeout=CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()


def drain(
    url: URL,
    engine: Engine,
    target: Callable[..., None],
    processes: int,
    queues: dict[str, int],
    handler: str,
    jobs: int,
) -> tuple[float, float]:
    """:func:`drain_costs`' rate (jobs per second) and worker CPU seconds per job."""
    drained = drain_costs(url, engine, target, processes, queues, handler, jobs)
    return drained.rate, drained.cpu / jobs


def drain_costs(
    url: URL,
    engine: Engine,
    target: Callable[..., None],
    processes: int,
    queues: dict[str, int],
    handler: str,
    jobs: int,
    *,
    probe: bool = False,
) -> Drained:
    """Release ``processes`` of ``target`` on the ``jobs`` jobs in the table and time them
    until none is ``available`` or ``running``.

    Returns the rate, the worker CPU summed over the processes and what they sent; with
    ``probe``, what the server did from the release to the end (:class:`ServerProbe`).

    Raises:
        BenchmarkError: a process died, or not every job ended ``completed``.
    """
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    children = [
        ctx.Process(
            target=_child,
            args=(target, _url_text(url), queues, handler, ready, go, stop, results),
            daemon=True,
        )
        for _ in range(processes)
    ]
    server = ServerProbe(engine) if probe else None
    for child in children:
        child.start()
    try:
        _wait_ready(ready, children)
        with engine.connect() as connection:
            if server is not None:
                poller = int(connection.scalar(text("SELECT pg_backend_pid()")) or 0)
                connection.rollback()
                server.start(excluded=[poller])
            started = time.perf_counter()
            go.set()
            while True:
                time.sleep(0.005)
                if not connection.scalar(NOT_DONE):
                    break
                connection.rollback()
                _check_alive(children)
            elapsed = time.perf_counter() - started
        cost = None if server is None else server.stop()
        stop.set()
        reports = [_result(results, children) for _ in children]
    finally:
        stop.set()
        _stop_all(children)
    with engine.connect() as connection:
        done = int(connection.scalar(COMPLETED) or 0)
    if done != jobs:
        raise BenchmarkError(f"{done} of {jobs} jobs ended completed; expected all of them")
    return Drained(
        jobs=jobs,
        rate=jobs / elapsed,
        cpu=sum(cpu for cpu, _ in reports),
        client=sum((sent for _, sent in reports), ClientCounts()),
        server=cost,
    )


def latencies(
    url: URL,
    target: Callable[..., None],
    queues: dict[str, int],
    handler: str,
    enqueue: Callable[[int], float],
    samples: int,
) -> list[float]:
    """Seconds from each enqueue's commit to its handler's start, one job at a time.

    ``enqueue(seq)`` commits one job and returns ``time.time()`` after the commit; the
    worker (one ``target`` process) reports ``time.time()`` where its handler starts.
    Between jobs the enqueuer sleeps 2 to 10 ms, so the worker is idle each time. The first
    :data:`WARM_UP` samples are not kept.
    """
    ctx = mp.get_context("spawn")
    ready, starts = ctx.Queue(), ctx.Queue()
    stop = ctx.Event()
    child = ctx.Process(
        target=_child,
        args=(target, _url_text(url), queues, handler, ready, stop, starts),
        daemon=True,
    )
    child.start()
    pauses = random.Random(1)
    result = []
    try:
        _wait_ready(ready, [child])
        for seq in range(-WARM_UP, samples):
            committed = enqueue(seq)
            try:
                got, started = starts.get(timeout=CHILD_TIMEOUT)
            except queue.Empty:
                _check_alive([child])
                raise BenchmarkError(
                    f"job {seq} did not start within {CHILD_TIMEOUT:.0f} s"
                ) from None
            if got != seq:
                raise BenchmarkError(f"expected job {seq} to start, got {got}")
            if seq >= 0:
                result.append(started - committed)
            time.sleep(pauses.uniform(0.002, 0.010))
    finally:
        stop.set()
        _stop_all([child])
    return result


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``, interpolated between the nearest
    ranks (numpy's default, ``statistics.quantiles``' inclusive method)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
