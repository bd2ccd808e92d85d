"""How long ``sa_jobs.stats()`` and a Prometheus scrape take on a big table.

Two tables, one after the other in the same database:

(a) ``--finished`` finished rows (the mix of ``bench/big_tables.py``: 90 % completed,
    4 % cancelled, 6 % discarded, over four queues) plus ``--available`` available ones
    — a queue that keeps a long history;
(b) the same table plus a ``--backlog`` of available jobs over three queues — a queue
    that has fallen behind, which is when someone runs ``sa-jobs stats``.

On each it times :func:`sa_jobs.stats` (default ``exact_limit``) and one collection of
:class:`sa_jobs.prometheus.QueueCollector` (the queue gauges a scrape reads), the median
of ``--rounds``, and prints what each reported and which states were estimated.

    python bench/stats_big.py --database sa_jobs_stats_big          # build and keep
    python bench/stats_big.py --database sa_jobs_stats_big --rounds 9   # reuse it

The rows are made by the server (``INSERT ... SELECT generate_series``). Not a test:
too slow for CI; the figures are in docs/observability.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import find_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_tables import AVAILABLE_ROWS, CHUNK, _big_database, fill, table_size, vacuum

BACKLOG_QUEUES = ("default", "mail", "reports")


def add_backlog(engine: Engine, n: int, say: Callable[[str], None]) -> None:
    for index, queue in enumerate(BACKLOG_QUEUES):
        share = n // len(BACKLOG_QUEUES) + (1 if index < n % len(BACKLOG_QUEUES) else 0)
        for lo in range(0, share, CHUNK):
            start = time.perf_counter()
            with engine.begin() as connection:
                connection.execute(text("SET LOCAL synchronous_commit = off"))
                connection.execute(
                    text(AVAILABLE_ROWS), {"n": min(CHUNK, share - lo), "queue": queue}
                )
            took = time.perf_counter() - start
            say(f"  backlog {queue}: {min(CHUNK, share - lo):,} in {took:.1f} s")
    vacuum(engine)


def timed(action: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(engine: Engine, rounds: int, say: Callable[[str], None]) -> None:
    from prometheus_client import CollectorRegistry

    from sa_jobs.prometheus import QueueCollector

    def read_stats() -> sa_jobs._inspect.queue_stats.Stats:
        with Session(engine) as session:
            return sa_jobs.stats(session)

    collector = QueueCollector(engine)
    CollectorRegistry().register(collector)
    seconds, found = timed(read_stats, rounds)
    totals = {state.value: n for state, n in found.totals.items() if n}
    estimated = sorted(state.value for state in found.estimated)
    say(f"  stats(): {seconds * 1000:.0f} ms (median of {rounds}); totals {totals}")
    say(f"    estimated: {estimated}")
    seconds, metrics = timed(lambda: list(collector.collect()), rounds)
    say(f"  collector scrape: {seconds * 1000:.0f} ms (median of {rounds})")
    for metric in metrics:
        for sample in metric.samples:
            say(f"    {sample.name}{sample.labels} {sample.value:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=10_000_000, help="finished rows")
    parser.add_argument("--available", type=int, default=100_000, help="available rows of (a)")
    parser.add_argument(
        "--backlog", type=int, default=3_000_000, help="available rows added for (b)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per figure")
    parser.add_argument("--database", help="keep (or reuse) the big database under this name")
    parser.add_argument("--build-only", action="store_true", help="fill (a), do not measure")
    parser.add_argument("--only-a", action="store_true", help="measure (a), add no backlog")
    options = parser.parse_args()
    server = find_server()

    def say(line: str) -> None:
        print(line, flush=True)

    with _big_database(server.url, options.database) as (url, built):
        engine = create_engine(url)
        sa_jobs.migrate(engine)
        with engine.connect() as connection:
            available = connection.scalar(
                text("SELECT count(*) FROM sa_job WHERE state = 'available'")
            )
        if not built:
            start = time.perf_counter()
            say(f"filling (a): {options.finished:,} finished, {options.available:,} available")
            fill(engine, options.finished, options.available, say)
            say(f"  built in {time.perf_counter() - start:.0f} s: {table_size(engine)}")
            available = options.available
        if options.build_only:
            engine.dispose()
            return
        if available <= options.available:
            say(f"(a) {table_size(engine)}")
            measure(engine, options.rounds, say)
            if options.only_a:
                engine.dispose()
                return
        if available <= options.available:
            start = time.perf_counter()
            say(f"adding (b): a backlog of {options.backlog:,} available jobs")
            add_backlog(engine, options.backlog, say)
            say(f"  built in {time.perf_counter() - start:.0f} s: {table_size(engine)}")
        say(f"(b) {table_size(engine)}")
        measure(engine, options.rounds, say)
        engine.dispose()


if __name__ == "__main__":
    main()
