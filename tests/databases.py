"""Throwaway databases with sa_jobs' schema installed, for fixtures that need their own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import URL, create_engine

import sa_jobs
from sa_jobs.devdb import Server, throwaway_database


@contextlib.contextmanager
def migrated_database(server: Server, prefix: str, *targets: str) -> Iterator[URL]:
    """A new database on ``server`` migrated to each of ``targets`` (default ``heads``);
    dropped on exit."""
    with throwaway_database(server, prefix=prefix) as url:
        engine = create_engine(url)
        try:
            for target in targets or ("heads",):
                sa_jobs.migrate(engine, target)
        finally:
            engine.dispose()
        yield url
