"""The project's own Alembic environment (see ``alembic.ini``).

It treats sa_jobs the way an application would: the shipped scripts through
``version_locations``, the default ``alembic_version`` table, and ``sa_jobs.metadata``
as the target, so ``alembic check`` here is the check an application's env would make.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import URL, Connection, create_engine
from sqlalchemy.pool import NullPool

import sa_jobs
from sa_jobs.devdb import URL_VARIABLES, normalize_url

config = context.config
target_metadata = sa_jobs.metadata

if config.config_file_name is not None:
    fileConfig(config.config_file_name)


def database_url() -> URL:
    # An explicit -x url= wins over the environment; nothing falls back to a default
    # server, so a forgotten variable cannot migrate some unrelated database.
    raw = context.get_x_argument(as_dictionary=True).get("url")
    raw = raw or next((os.environ[name] for name in URL_VARIABLES if os.environ.get(name)), None)
    if not raw:
        raise SystemExit(
            "no database: pass -x url=postgresql://... or set " + " or ".join(URL_VARIABLES)
        )
    return normalize_url(raw)


def configure(**options: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        # The models spell defaults as the server reports them, so comparing them is
        # cheap and catches a default changed in one place only.
        compare_server_default=True,
        **options,
    )


def run_offline() -> None:
    # `alembic upgrade heads --sql`: review the DDL without a connection.
    configure(url=database_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: Connection) -> None:
    configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    engine = create_engine(database_url(), poolclass=NullPool)
    with engine.connect() as connection:
        run_online(connection)
        connection.commit()
    engine.dispose()
