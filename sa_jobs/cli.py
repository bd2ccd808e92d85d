"""The ``sa-jobs`` command line: migrate, work, jobs list|show|retry|cancel, demo.

Every command returns an exit code from :func:`main`; expected failures (no such job,
a job in the wrong state, an unreachable database, a missing schema) print one line to
stderr and exit 1, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from alembic.util import CommandError as AlembicCommandError
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.pool import NullPool

from sa_jobs.devdb import URL_VARIABLES, normalize_url
from sa_jobs.errors import SaJobsError
from sa_jobs.worker import Worker

__all__ = ["CommandError", "main"]

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class CommandError(Exception):
    """A failure the user can fix from the command line; printed as one line."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sa-jobs`` with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    A mistake the user can fix — a bad or unreachable URL, an unknown revision, a job
    that does not exist, a schema another tool manages — prints one line to stderr and
    exits 1. Only a bug in sa_jobs itself shows a traceback.
    """
    options = _parser().parse_args(argv)
    try:
        result: int = options.run(options)
        return result
    except (CommandError, SaJobsError, AlembicCommandError) as exc:
        _fail(_first_line(exc))
    except NoSuchModuleError as exc:
        _fail(f"unknown database driver in the URL ({_first_line(exc)})")
    except OperationalError as exc:
        _fail(f"cannot reach the database: {_first_line(exc.orig or exc)}")
    except DBAPIError as exc:
        _fail(f"the database refused: {_first_line(exc.orig or exc)}")
    except KeyboardInterrupt:
        return 130
    return 1


def _fail(message: str) -> None:
    print(f"sa-jobs: {message}", file=sys.stderr)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported on one line like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from sa_jobs import cli_jobs

    parser = _Parser(prog="sa-jobs", description="sa_jobs, a PostgreSQL job queue for SQLAlchemy.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="install or upgrade sa_jobs' tables")
    add_url_option(migrate)
    migrate.add_argument(
        "--target",
        default="heads",
        help="Alembic target: heads (default, every branch) or e.g. sa_jobs_core@head",
    )
    migrate.add_argument(
        "--downgrade", metavar="TARGET", help="downgrade to TARGET instead (base removes all)"
    )
    migrate.set_defaults(run=_migrate)

    work = commands.add_parser(
        "work",
        help="run a worker until SIGTERM/SIGINT",
        description="Import MODULE (the current directory is on the path), take ATTRIBUTE — "
        "a sa_jobs.Worker, or a function of no arguments returning one — and run it until "
        "SIGTERM or SIGINT. A first signal lets running jobs finish; a second cancels them.",
    )
    work.add_argument("app", metavar="MODULE:ATTRIBUTE", help="e.g. myapp.jobs:worker")
    work.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="logging level (default INFO)",
    )
    work.set_defaults(run=_work)

    cli_jobs.add_commands(commands)

    demo = commands.add_parser("demo", help="a short tour against a throwaway database")
    demo.set_defaults(run=_demo)
    return parser


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


def _migrate(options: argparse.Namespace) -> int:
    from sa_jobs.schema import downgrade, migrate

    engine = engine_from(options)
    try:
        if options.downgrade:
            downgrade(engine, options.downgrade)
            print(f"sa_jobs schema downgraded to {options.downgrade}")
        else:
            migrate(engine, options.target)
            print(f"sa_jobs schema upgraded to {options.target}")
    finally:
        engine.dispose()
    return 0


def _work(options: argparse.Namespace) -> int:
    logging.basicConfig(level=options.log_level, format=LOG_FORMAT)
    worker = load_worker(options.app)
    worker.run()
    return 0


def load_worker(spec: str) -> Worker:
    """Import ``MODULE:ATTRIBUTE`` and return the :class:`sa_jobs.Worker` it names.

    ``ATTRIBUTE`` may be dotted (``module:app.worker``) and may name a function of no
    arguments that returns the worker. The current directory goes first on
    ``sys.path``, as ``uvicorn`` and ``celery`` do, so ``sa-jobs work app:worker`` finds
    ``./app.py``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{spec!r} is not MODULE:ATTRIBUTE, e.g. myapp.jobs:worker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing *named* module is the user's typo; a missing import inside it
        # is a bug in their code and keeps its traceback.
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise
        raise CommandError(f"cannot import module {module_name!r}: {exc}") from None
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Worker) and callable(target):
        target = target()
    if not isinstance(target, Worker):
        raise CommandError(
            f"{spec} is a {type(target).__name__}, not a sa_jobs.Worker "
            "(or a function of no arguments returning one)"
        )
    return target


def _is_prefix(name: str, module_name: str) -> bool:
    return module_name == name or module_name.startswith(name + ".")


def _demo(_options: argparse.Namespace) -> int:
    from sa_jobs import demo

    demo.run()
    return 0


if __name__ == "__main__":
    # Under `python -m sa_jobs.cli` this file is `__main__`; run the `sa_jobs.cli` that
    # cli_jobs imports, so there is one CommandError class, not two.
    from sa_jobs.cli import main as _main

    raise SystemExit(_main())
