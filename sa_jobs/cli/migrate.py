"""``sa-jobs migrate``: install, upgrade or downgrade sa_jobs' schema."""

from __future__ import annotations

import argparse
from typing import Any

from sa_jobs.cli.common import add_url_option, engine_from
from sa_jobs.schema import downgrade, migrate

__all__ = ["add_command"]


def add_command(commands: Any) -> None:
    parser = commands.add_parser("migrate", help="install or upgrade sa_jobs' tables")
    add_url_option(parser)
    parser.add_argument(
        "--target",
        default="heads",
        help="Alembic target: heads (default, every branch) or e.g. sa_jobs_core@head",
    )
    parser.add_argument(
        "--downgrade", metavar="TARGET", help="downgrade to TARGET instead (base removes all)"
    )
    parser.set_defaults(run=_migrate)


def _migrate(options: argparse.Namespace) -> int:

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
