"""A fetch's opening query (``sa_jobs.worker.opening``) fails as SQLAlchemy would.

Its BEGIN, settings and first statements go through psycopg's own calls, not
SQLAlchemy's. A connection lost under them must still surface as SQLAlchemy's
``OperationalError`` saying the connection was invalidated — the worker retries those as
an outage instead of logging a failure at every attempt (``db_access.is_transient``) —
and the pool must drop that connection rather than try to reset it. The server ends the
backend for real (``pg_terminate_backend``), as a restart would.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import URL, Engine, select, text
from sqlalchemy.exc import OperationalError

from sa_jobs._table.models import Job
from sa_jobs.worker.db_access import is_transient
from sa_jobs.worker.opening import GENERIC_PLANS, opened_transaction
from tests.helpers import engine_at


def _terminate(engine: Engine, pid: int) -> None:
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


@pytest.mark.parametrize("where", ["opening", "commit"])
def test_a_lost_connection_is_an_invalidated_operational_error(
    engine: Engine, database_url: URL, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    caplog.set_level(logging.ERROR, logger="sqlalchemy.pool")
    with engine_at(database_url, pool_size=1, max_overflow=0) as fetching:
        with fetching.connect() as connection:
            pid = connection.scalar(text("SELECT pg_backend_pid()"))
        assert isinstance(pid, int)
        statements = (select(Job.id).limit(1),)
        with pytest.raises(OperationalError) as raised:
            if where == "opening":
                _terminate(engine, pid)
                with opened_transaction(fetching, statements, settings=GENERIC_PLANS):
                    pytest.fail("the opening query ran on a terminated backend")
            else:
                with opened_transaction(fetching, statements, settings=GENERIC_PLANS):
                    _terminate(engine, pid)
        assert raised.value.connection_invalidated
        assert is_transient(raised.value)
        # The pool dropped the lost connection: the next checkout is a new backend, and
        # nothing was logged about failing to reset the old one.
        with fetching.connect() as connection:
            assert connection.scalar(text("SELECT pg_backend_pid()")) != pid
    assert not [r for r in caplog.records if "reset" in r.getMessage()]


def test_an_error_of_the_block_itself_is_raised_unchanged(engine: Engine) -> None:
    class Mine(Exception):
        pass

    with pytest.raises(Mine) as raised, opened_transaction(engine, (), settings=GENERIC_PLANS):
        raise Mine
    assert raised.value.__cause__ is None
    # The transaction was rolled back and the connection is fine for the next one.
    with opened_transaction(engine, (select(Job.id).limit(1),)) as (_, reads):
        assert reads[0].rows == []
