"""What several bench scripts share: a throwaway database, and the worker's drain.

Imported as ``_shared`` (a script's own directory is first on ``sys.path``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine

import sa_jobs
from sa_jobs._base.records import Outcome
from sa_jobs._table.schema import Features
from sa_jobs.devdb import find_server, throwaway_database
from sa_jobs.worker.completer import write_outcomes
from sa_jobs.worker.producer import fetch_jobs


@contextmanager
def database(
    prefix: str, targets: Sequence[str] = ("heads",), pool_size: int = 2
) -> Iterator[Engine]:
    """A database of its own on the local (or embedded) server, migrated to ``targets``,
    dropped on the way out."""
    with throwaway_database(find_server(), prefix=prefix) as url:
        engine = create_engine(url, pool_size=pool_size)
        for target in targets:
            sa_jobs.migrate(engine, target)
        try:
            yield engine
        finally:
            engine.dispose()


def drain(engine: Engine, batch: int = 10) -> tuple[int, float]:
    """Work queue ``default`` the worker's way on one thread, no-op handlers: its fetch
    (:func:`fetch_jobs`), then the completer's write of the batch. Returns the jobs
    worked and the seconds it took."""
    with engine.connect() as connection:
        features = Features.of(connection)
    done = 0
    began = time.perf_counter()
    while jobs := fetch_jobs(engine, "default", batch, "bench", features=features):
        write_outcomes(engine, [Outcome.completed(job) for job in jobs], features)
        done += len(jobs)
    return done, time.perf_counter() - began
