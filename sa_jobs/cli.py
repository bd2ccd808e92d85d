"""The ``sa-jobs`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sqlalchemy import create_engine

from sa_jobs.devdb import URL_VARIABLES, normalize_url
from sa_jobs.errors import SaJobsError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    try:
        result: int = options.run(options)
        return result
    except SaJobsError as exc:
        print(f"sa-jobs: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sa-jobs", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="install or upgrade sa_jobs' tables")
    _add_url(migrate)
    migrate.add_argument(
        "--target",
        default="heads",
        help="Alembic target: heads (default, every branch) or e.g. sa_jobs_core@head",
    )
    migrate.add_argument(
        "--downgrade", metavar="TARGET", help="downgrade to TARGET instead (base removes all)"
    )
    migrate.set_defaults(run=_migrate)

    demo = commands.add_parser("demo", help="a short tour against a throwaway database")
    demo.set_defaults(run=_demo)
    return parser


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="database URL (default: $SA_JOBS_DATABASE_URL, then $DATABASE_URL)",
    )


def _url(options: argparse.Namespace) -> str:
    raw = options.url or next((os.environ[v] for v in URL_VARIABLES if os.environ.get(v)), None)
    if not raw:
        raise SystemExit("sa-jobs: no database; pass --url or set SA_JOBS_DATABASE_URL")
    return normalize_url(raw).render_as_string(hide_password=False)


def _migrate(options: argparse.Namespace) -> int:
    from sa_jobs.schema import downgrade, migrate

    engine = create_engine(_url(options))
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


def _demo(_options: argparse.Namespace) -> int:
    from sa_jobs import demo

    demo.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
