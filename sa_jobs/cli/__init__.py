"""The ``sa-jobs`` command line: migrate, work, jobs, queue, periodic list, stats, health,
bench, dashboard, demo.

Every command returns an exit code from :func:`main`; expected failures (no such job,
a job in the wrong state, an unreachable database, a missing schema) print one line to
stderr and exit 1, without a traceback; a bad option or ``SA_JOBS_*`` value exits 2.
Each command lives in a module of its own; the options every command shares and the
environment variables behind them are in :mod:`sa_jobs.cli.settings`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from alembic.util import CommandError as AlembicCommandError
from sqlalchemy.exc import DBAPIError, NoSuchModuleError, OperationalError

import sa_jobs
from sa_jobs.cli import (
    bench,
    dashboard,
    demo,
    jobs,
    migrate,
    periodic,
    queues,
    settings,
    stats,
    work,
    workflows,
)
from sa_jobs.cli.common import CommandError, Parser, connection_failure, first_line, parse_url
from sa_jobs.devdb import Server
from sa_jobs.errors import SaJobsError

__all__ = ["CommandError", "main"]

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sa-jobs`` with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    A mistake the user can fix — a bad or unreachable URL, an unknown revision, a job
    that does not exist, a schema another tool manages — prints one line to stderr and
    exits 1 (2 for a bad option or variable). Only a bug in sa_jobs itself shows a
    traceback.
    """
    options = _parser().parse_args(argv)
    try:
        settings.resolve(options, options.settings)
        level = options.log_level or options.default_log_level
        logging.basicConfig(level=level, format=LOG_FORMAT)
        result: int = options.run(options)
        return result
    except CommandError as exc:
        _fail(first_line(exc))
        return exc.exit_code
    except (SaJobsError, AlembicCommandError) as exc:
        _fail(first_line(exc))
    except NoSuchModuleError as exc:
        _fail(f"unknown database driver in the URL ({first_line(exc)})")
    except OperationalError as exc:
        _fail(connection_failure(exc))
    except DBAPIError as exc:
        _fail(f"the database refused: {first_line(exc.orig or exc)}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`sa-jobs migrate --sql | head`): nothing to report, and
        # Python's own flush at exit must not fail on the closed pipe again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 1


def _fail(message: str) -> None:
    print(f"sa-jobs: {message}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    common = settings.global_options()
    parser = Parser(
        prog="sa-jobs",
        description="sa_jobs, a PostgreSQL job queue for SQLAlchemy. Every option can also "
        "come from an SA_JOBS_* environment variable (see docs/cli.md); the command line "
        "wins.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"sa-jobs {sa_jobs.__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=Parser)
    migrate.add_command(commands, common)
    work.add_command(commands, common)
    jobs.add_commands(commands, common)
    workflows.add_commands(commands, common)
    stats.add_commands(commands, common)
    periodic.add_commands(commands, common)
    queues.add_command(commands, common)
    bench.add_command(commands, common)
    dashboard.add_command(commands, common)
    tour = commands.add_parser(
        "demo", parents=[common], help="a short tour against a throwaway database"
    )
    tour.set_defaults(run=_demo, settings=(settings.URL, settings.LOG_LEVEL))
    # Each command names the settings it reads (above); work logs at INFO, the others
    # only say something when it matters.
    parser.set_defaults(default_log_level="WARNING")
    return parser


def _demo(options: argparse.Namespace) -> int:
    server = None
    if options.url:
        url = parse_url(options.url)
        server = Server(url, f"--url ({url.render_as_string(hide_password=True)})")
    demo.run(server=server)
    return 0
