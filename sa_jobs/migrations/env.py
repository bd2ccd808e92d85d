"""Alembic environment used by ``sa_jobs.migrate()`` and ``sa-jobs migrate``.

Applications with their own Alembic environment do not use this file: they only add
``sa_jobs:migrations/versions`` to ``version_locations``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from sa_jobs._table.models import metadata

config = context.config


def run() -> None:
    version_table = config.attributes.get("version_table", "sa_jobs_alembic_version")
    connection = config.attributes.get("connection")
    if connection is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
        with engine.connect() as connection:
            _run_on(connection, version_table)
            connection.commit()
        engine.dispose()
        return
    _run_on(connection, version_table)


def _run_on(connection: Connection, version_table: str) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=version_table,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
