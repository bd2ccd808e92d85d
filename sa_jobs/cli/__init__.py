"""The ``sa-jobs`` command line: migrate, work, jobs list|show|retry|cancel, demo.

Every command returns an exit code from :func:`main`; expected failures (no such job,
a job in the wrong state, an unreachable database, a missing schema) print one line to
stderr and exit 1, without a traceback. Each command lives in a module of its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from alembic.util import CommandError as AlembicCommandError
from sqlalchemy.exc import DBAPIError, NoSuchModuleError, OperationalError

from sa_jobs import demo
from sa_jobs.cli import jobs, migrate, work
from sa_jobs.cli.common import CommandError, first_line
from sa_jobs.errors import SaJobsError

__all__ = ["CommandError", "main"]


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
        _fail(first_line(exc))
    except NoSuchModuleError as exc:
        _fail(f"unknown database driver in the URL ({first_line(exc)})")
    except OperationalError as exc:
        _fail(f"cannot reach the database: {first_line(exc.orig or exc)}")
    except DBAPIError as exc:
        _fail(f"the database refused: {first_line(exc.orig or exc)}")
    except KeyboardInterrupt:
        return 130
    return 1


def _fail(message: str) -> None:
    print(f"sa-jobs: {message}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported on one line like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sa-jobs", description="sa_jobs, a PostgreSQL job queue for SQLAlchemy.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    migrate.add_command(commands)
    work.add_command(commands)
    jobs.add_commands(commands)
    tour = commands.add_parser("demo", help="a short tour against a throwaway database")
    tour.set_defaults(run=_demo)
    return parser


def _demo(_options: argparse.Namespace) -> int:
    demo.run()
    return 0
