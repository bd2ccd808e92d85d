"""``sa-jobs migrate``: install, upgrade or downgrade sa_jobs' schema, show the SQL it
would run, or say which revisions are installed and which are pending."""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

from alembic import command
from sqlalchemy import Connection, Engine, create_mock_engine, func, select

from sa_jobs._table.schema import (
    MIGRATION_LOCK_KEY,
    VERSION_TABLE,
    alembic_config,
    downgrade,
    installed_branches,
    migrate,
)
from sa_jobs.cli import settings
from sa_jobs.cli.common import UsageError, engine_from, format_table
from sa_jobs.cli.revisions import (
    applied_between,
    branch_status,
    describe,
    recorded_heads,
    scripts,
)
from sa_jobs.errors import SchemaManagedElsewhereError

__all__ = ["add_command"]

#: What ``migrate`` reads from the environment. ``--downgrade``, ``--sql`` and
#: ``--status`` are what to do this time, never a standing setting: a forgotten
#: ``SA_JOBS_DOWNGRADE=base`` in a deployment would drop the jobs table.
SETTINGS = (settings.URL, settings.LOG_LEVEL, settings.MIGRATE_TARGET)

#: Alembic's offline mode needs only a dialect; a mock engine gives it one without a
#: database (and without a driver connecting anywhere).
OFFLINE_URL = "postgresql+psycopg://"


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "migrate",
        parents=[common],
        help="install or upgrade sa_jobs' tables (or show their status, or the SQL)",
        description="Upgrade sa_jobs' schema (every branch by default) and say what was "
        "applied. --status shows each branch's installed and pending revisions; --sql "
        "prints the SQL instead of running it (no database needed).",
    )
    parser.add_argument(
        "--target",
        default=argparse.SUPPRESS,
        help="Alembic target: heads (default, every branch) or e.g. sa_jobs_core@head; "
        "with --sql also a range FROM:TO (default: $SA_JOBS_MIGRATE_TARGET, else heads)",
    )
    parser.add_argument(
        "--downgrade",
        metavar="TARGET",
        help="downgrade to TARGET instead (base removes all; with --sql: FROM:TO)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL (Alembic's offline mode) instead of running it",
    )
    mode.add_argument(
        "--status",
        action="store_true",
        help="say which revisions of each branch are installed and which are pending",
    )
    parser.set_defaults(run=_migrate, settings=SETTINGS)


def _migrate(options: argparse.Namespace) -> int:
    if options.status and options.downgrade:
        raise UsageError("--status only reports; leave out --downgrade")
    if options.sql:
        return _print_sql(options)
    engine = engine_from(options)
    try:
        if options.status:
            return _status(engine)
        return _apply(engine, options)
    finally:
        engine.dispose()


def _apply(engine: Engine, options: argparse.Namespace) -> int:
    script = scripts()
    with engine.begin() as connection:
        # The lock migrate() takes, taken first so that "before" cannot change under us
        # (advisory transaction locks are reentrant within a session).
        connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        before = recorded_heads(connection)
        if options.downgrade:
            downgrade(connection, options.downgrade)
        else:
            migrate(connection, options.target)
        after = recorded_heads(connection)
    if options.downgrade:
        removed = applied_between(script, after, before)
        for revision in reversed(removed):
            print(f"removed {describe(revision)}")
        if removed:
            print(f"sa_jobs schema downgraded to {options.downgrade}")
        else:
            print(f"sa_jobs schema already at {options.downgrade}: nothing to remove")
        return 0
    applied = applied_between(script, before, after)
    for revision in applied:
        print(f"applied {describe(revision)}")
    if applied:
        print(f"sa_jobs schema upgraded to {options.target}")
    else:
        print(f"sa_jobs schema already up to date ({options.target}): nothing to apply")
    return 0


def _status(engine: Engine) -> int:
    script = scripts()
    with engine.connect() as connection:
        heads = recorded_heads(connection)
        source = VERSION_TABLE
        if not heads and installed_branches(connection):
            # Installed by the application's own Alembic env: its table records them.
            known = {revision.revision for revision in script.walk_revisions()}
            heads = tuple(h for h in recorded_heads(connection, "alembic_version") if h in known)
            source = "alembic_version (your application's Alembic environment)"
            if not heads:
                raise SchemaManagedElsewhereError(VERSION_TABLE)
    statuses = branch_status(script, heads)
    rows = [
        (status.branch, status.installed or "-", ", ".join(status.pending) or "-")
        for status in statuses
    ]
    print(format_table(("branch", "installed", "pending"), rows))
    pending = sum(len(status.pending) for status in statuses)
    if pending:
        print(f"{pending} revision{'s' if pending > 1 else ''} pending: run sa-jobs migrate")
    else:
        print("up to date")
    if source != VERSION_TABLE:
        print(f"(recorded in {source})")
    return 0


def _print_sql(options: argparse.Namespace) -> int:
    """Alembic's offline mode: the statements on stdout, nothing connected to."""
    mock = create_mock_engine(OFFLINE_URL, lambda *_args, **_kwargs: None)
    # alembic_config wants a Connection; in offline mode Alembic only reads its dialect.
    config = alembic_config(cast(Connection, mock))
    config.output_buffer = sys.stdout
    if options.downgrade:
        command.downgrade(config, options.downgrade, sql=True)
    else:
        command.upgrade(config, options.target, sql=True)
    return 0
