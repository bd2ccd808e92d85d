"""What every ``sa-jobs`` command shares: the one-line error, the ``--url`` option, and
the engine it opens."""

from __future__ import annotations

import argparse
import os

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from sa_jobs.devdb import URL_VARIABLES, normalize_url

__all__ = ["CommandError", "add_url_option", "engine_from", "first_line"]


class CommandError(Exception):
    """A failure the user can fix from the command line; printed as one line."""


def add_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="database URL (default: $SA_JOBS_DATABASE_URL, then $DATABASE_URL)",
    )


def engine_from(options: argparse.Namespace) -> Engine:
    """An engine on ``--url`` or the first URL variable set; one connection at a time."""
    raw = options.url or next((os.environ[v] for v in URL_VARIABLES if os.environ.get(v)), None)
    if not raw:
        raise CommandError("no database; pass --url or set SA_JOBS_DATABASE_URL")
    try:
        url = normalize_url(raw)
    except (ArgumentError, ValueError):
        # Not echoed: a URL may hold a password.
        raise CommandError(
            "the database URL cannot be parsed; expected e.g. postgresql://user@host:5432/dbname"
        ) from None
    return create_engine(url, poolclass=NullPool)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
