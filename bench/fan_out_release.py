"""How the release of a fan-out's dependents grows with their number.

Not a test. For each size n, a throwaway database (``sa_jobs.devdb``) gets a 1 → n → 1
workflow; the root step is fetched and its completion written the worker's way
(``write_outcomes``), which releases the n dependents in the same statement. Printed: the
seconds that write took. Linear is the aim: until 2026-11-28 the release looked each
dependent's count up with ``array_position`` in an array of all of them, which made it
quadratic (50,000 dependents: 42 s).

    python bench/fan_out_release.py 1000 5000 20000 100000
"""

from __future__ import annotations

import argparse
import time

from _shared import database

from sa_jobs._base.records import Outcome
from sa_jobs._table.schema import Features
from sa_jobs.benchmark import workflows
from sa_jobs.worker.completer import write_outcomes
from sa_jobs.worker.producer import fetch_jobs


def release_seconds(n: int) -> float:
    with database("sa_jobs_fan_release") as engine:
        with engine.connect() as connection:
            features = Features.of(connection)
        workflows._fan(engine, n)
        (root,) = fetch_jobs(engine, workflows.QUEUE, 10, "bench", features=features)
        began = time.perf_counter()
        write_outcomes(engine, [Outcome.completed(root)], features)
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1_000, 5_000, 20_000])
    for n in parser.parse_args().sizes:
        seconds = release_seconds(n)
        print(f"{n:>9,} dependents released in {seconds:7.2f} s ({seconds / n * 1e6:5.1f} µs each)")


if __name__ == "__main__":
    main()
