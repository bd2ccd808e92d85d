"""Unique inserts against a table full of held keys: the work is per key inserted.

Before each unique insert takes its keys, it releases those held under an expired TTL
(``release_expired_locks``). These tests read the plan PostgreSQL actually ran (``EXPLAIN
ANALYZE`` of the very statement and parameters an insert sent) and check how many rows of
``sa_job`` it touched: a handful, not one per key already in the table. They do so for
the plan made for one run and for the generic plan a pooled connection caches while the
table is small and keeps as it grows. They also check that the step is skipped outright
while no TTL lock has expired, and that a database without ``sa_job_unique_ttl_idx``
(the unique branch's first revision only) still works.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import sa_jobs
from sa_jobs import InsertManyParams, UniqueOpts
from sa_jobs.devdb import Server
from tests.factories import expire_ttl_locks
from tests.helpers import (
    engine_at,
    insert_through,
    migrated_database,
    migrated_engine,
    plan_nodes,
    sent_statements,
)

BY_ARGS = UniqueOpts(by_args=True)
HOUR = dt.timedelta(hours=1)
#: Keys already held in the table; enough that reading them all is unmistakable.
HELD = 4000
#: How many rows of sa_job one plan node may touch for a batch of a few keys.
PER_NODE_LIMIT = 50


@sa_jobs.job_args(kind="test_unique_scale.account", unique=BY_ARGS)
class Account:
    account_id: int = 0


@sa_jobs.job_args(kind="test_unique_scale.report")
class Report:
    report_id: int = 0


def hold_keys(
    engine: Engine,
    *,
    ttl: dt.timedelta | None,
    expired: bool = False,
    first: int = 0,
    count: int = HELD,
) -> None:
    """Add jobs holding keys first..count-1 (under a TTL if ``ttl``; expired if ``expired``)."""
    unique = UniqueOpts(by_args=True, ttl=ttl)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session, [Account(n) for n in range(first, count)], unique=unique
        )
    if expired:
        expire_ttl_locks(engine, [result.job.id for result in results])


def is_job_insert(statement: str) -> bool:
    return statement.lstrip().startswith(("WITH", "INSERT")) and "sa_job" in statement


def inserts_sent(
    through: Engine | Connection,
) -> contextlib.AbstractContextManager[list[tuple[str, Any]]]:
    """Records each INSERT into sa_job sent ``through`` the engine or connection, as the
    statement and parameters the driver got."""
    return sent_statements(through, keep=is_job_insert)


def sent_by(engine: Engine, insert: Callable[[Session], Any]) -> tuple[str, dict[str, Any]]:
    """The INSERT statement and parameters that ``insert`` sends to the driver (it runs
    in a transaction that rolls back)."""
    with inserts_sent(engine) as sent, Session(engine) as session, session.begin():
        insert(session)
        session.rollback()
    ((statement, parameters),) = sent
    return statement, parameters


def plan_root(explained: Any) -> dict[str, Any]:
    """The top node of an ``EXPLAIN (FORMAT JSON)`` result."""
    root: dict[str, Any] = explained[0]["Plan"]
    return root


def explain_insert(engine: Engine, insert: Callable[[Session], Any]) -> dict[str, Any]:
    """The plan (EXPLAIN ANALYZE, JSON) of the INSERT that ``insert`` sends, planned
    for its parameters as a one-off statement is."""
    statement, parameters = sent_by(engine, insert)
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).scalar_one()
        connection.rollback()
    return plan_root(plan)


@contextlib.contextmanager
def warmed_connection(engine: Engine) -> Iterator[Callable[[], dict[str, Any]]]:
    """A connection that has run unique inserts until PostgreSQL settled on a cached plan
    for them; yields a function that explains (EXPLAIN ANALYZE, JSON) running the last
    one again through that very plan.

    That is what a pooled connection does: psycopg prepares a statement on its fifth run,
    and PostgreSQL then switches to a generic plan, made without the parameters' values
    for the table as it was at that moment, and keeps it as the table grows until the
    next ANALYZE. The table is small here while the plan is made.
    """
    own = create_engine(engine.url, poolclass=NullPool)
    try:
        with own.connect() as connection:
            with inserts_sent(connection) as sent:
                for n in range(10):  # what an application does: plain, unique and TTL jobs
                    for args, unique in (
                        (Report(n), None),
                        (Account(10**6 + n), BY_ARGS),
                        (Account(2 * 10**6 + n), UniqueOpts(by_args=True, ttl=HOUR)),
                    ):
                        with Session(bind=connection) as session:
                            sa_jobs.insert(session, args, unique=unique)
                            session.commit()
            # No rollback from here on: psycopg forgets its prepared statements on one.
            name, generic_plans, types = connection.execute(
                text(
                    "SELECT name, generic_plans, parameter_types::text[]"
                    " FROM pg_prepared_statements WHERE statement LIKE :released"
                ),
                {"released": "%released_unique_keys%"},
            ).one()
            assert generic_plans > 0, "PostgreSQL never used a cached plan: nothing to test"
            statement, parameters = [s for s in sent if "released_unique_keys" in s[0]][-1]
            # psycopg numbers named parameters in order of first appearance; EXECUTE inside
            # EXPLAIN takes no bound parameters, so the values go in as literals.
            names = dict.fromkeys(re.findall(r"%\((\w+)\)s", statement))
            arguments = sql.SQL(", ").join(
                sql.SQL("{}::{}").format(sql.Literal(parameters[name]), sql.SQL(type_))
                for name, type_ in zip(names, types, strict=True)
            )
            explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {} ({})").format(
                sql.Identifier(name), arguments
            )
            driver = connection.connection.driver_connection
            assert driver is not None

            def explain_last_insert() -> dict[str, Any]:
                return plan_root(connection.exec_driver_sql(explain.as_string(driver)).scalar_one())

            yield explain_last_insert
            connection.rollback()
    finally:
        own.dispose()


def rows_touched(node: dict[str, Any]) -> int:
    """Rows a node produced or read and threw away, over all its loops."""
    loops = max(node.get("Actual Loops", 1), 1)
    per_loop = (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )
    return int(per_loop * loops)


def reads_sa_job(node: dict[str, Any]) -> bool:
    # Table scans name the relation; bitmap index scans only the index.
    if node.get("Node Type") in ("ModifyTable", "Result", "CTE Scan"):
        return False
    return node.get("Relation Name") == "sa_job" or str(node.get("Index Name", "")).startswith(
        "sa_job_"
    )


def heaviest_reads(plan: dict[str, Any]) -> list[tuple[int, str]]:
    return sorted(
        (
            (rows_touched(n), f"{n['Node Type']} {n.get('Index Name', '')}".strip())
            for n in plan_nodes(plan)
            if reads_sa_job(n)
        ),
        reverse=True,
    )


def release_step(plan: dict[str, Any]) -> dict[str, Any]:
    (cte,) = [n for n in plan_nodes(plan) if n.get("Subplan Name") == "CTE released_unique_keys"]
    return cte


def insert_batch(account_ids: list[int]) -> Callable[[Session], Any]:
    return lambda session: sa_jobs.insert_many(session, [Account(n) for n in account_ids])


# ------------------------------------------------------------------ how much is read


HELD_KINDS = {
    "no-ttl-locks": {"ttl": None},
    "ttl-locks": {"ttl": HOUR},
    "expired-ttl-locks": {"ttl": HOUR, "expired": True},
}


@pytest.mark.parametrize("held", HELD_KINDS.values(), ids=HELD_KINDS.keys())
@pytest.mark.parametrize(
    "batch", [[HELD + 1], [*range(HELD, HELD + 5), 7, 8]], ids=["one", "seven"]
)
def test_a_unique_insert_reads_only_its_own_keys_however_many_are_held(
    engine: Engine, held: dict[str, Any], batch: list[int]
) -> None:
    hold_keys(engine, **held)
    with engine.begin() as connection:
        connection.execute(text("ANALYZE sa_job"))
    plan = explain_insert(engine, insert_batch(batch))
    assert_reads_only_its_own_keys(plan, batch)


@pytest.fixture
def fresh_engine(pg_server: Server) -> Iterator[Engine]:
    """A database of its own, never analyzed: the state a new deployment starts in."""
    with migrated_engine(pg_server, "sa_jobs_unique_fresh") as engine:
        yield engine


@pytest.mark.parametrize("held", HELD_KINDS.values(), ids=HELD_KINDS.keys())
def test_a_plan_cached_while_the_table_was_small_still_reads_only_its_own_keys(
    fresh_engine: Engine, held: dict[str, Any]
) -> None:
    with warmed_connection(fresh_engine) as explain_last_insert:
        hold_keys(fresh_engine, **held)
        plan = explain_last_insert()
    assert_reads_only_its_own_keys(plan, [2 * 10**6 + 9])


def assert_reads_only_its_own_keys(plan: dict[str, Any], batch: list[int]) -> None:
    heaviest = heaviest_reads(plan)
    assert heaviest, "the plan reads sa_job somewhere (the conflict check at least)"
    assert heaviest[0][0] <= PER_NODE_LIMIT, (
        f"a plan node read {heaviest[0][0]} rows of sa_job for a batch of {len(batch)} "
        f"with {HELD} keys held: {heaviest[:3]}"
    )


def test_the_first_insert_into_a_fresh_table_reads_only_its_own_keys(engine: Engine) -> None:
    # No ANALYZE: the planner's guess for the partial unique index is what misled it.
    hold_keys(engine, ttl=HOUR)
    plan = explain_insert(engine, insert_batch([HELD + 1]))
    assert heaviest_reads(plan)[0][0] <= PER_NODE_LIMIT, heaviest_reads(plan)[:3]


@pytest.mark.parametrize("ttl", [None, HOUR], ids=["no-ttl-locks", "unexpired-ttl-locks"])
def test_without_an_expired_lock_the_release_step_reads_nothing(
    engine: Engine, ttl: dt.timedelta | None
) -> None:
    hold_keys(engine, ttl=ttl)
    plan = explain_insert(engine, insert_batch([HELD + 1, HELD + 2, 7]))
    step = release_step(plan)
    executed = [n for n in plan_nodes(step) if n.get("Actual Loops", 0) > 0]
    # Only the guard ran: one lookup at the low end of the index of TTL holders, which
    # found no lock or one that has not expired.
    guard = [n for n in executed if reads_sa_job(n)]
    assert [n.get("Index Name") for n in guard] == ["sa_job_unique_ttl_idx"]
    assert [rows_touched(n) for n in guard] == [0 if ttl is None else 1]
    # The batch's keys (read from the parsed rows) are never even looked at.
    batch_reads = [n for n in plan_nodes(step) if n["Node Type"] in ("CTE Scan", "Function Scan")]
    assert batch_reads and all(n.get("Actual Loops", 0) == 0 for n in batch_reads)


def test_expired_locks_among_many_held_are_released_and_only_those(engine: Engine) -> None:
    hold_keys(engine, ttl=HOUR, expired=True)  # keys 0..HELD-1, every lock expired
    with Session(engine) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                Account(3),  # expired holder: released, a new job takes the key
                Account(HELD + 1),  # a new key
                InsertManyParams(Account(3), sa_jobs.InsertOpts(unique=BY_ARGS)),  # folded
            ],
        )
        outcome = [(r.job.id, r.unique_skipped_as_duplicate) for r in results]
    assert [skipped for _, skipped in outcome] == [False, False, True]
    assert outcome[0][0] > HELD and outcome[2][0] == outcome[0][0]
    with engine.connect() as connection:
        released = connection.scalar(text("SELECT count(*) FROM sa_job WHERE unique_key IS NULL"))
        held = connection.scalar(text("SELECT count(*) FROM sa_job WHERE unique_key IS NOT NULL"))
    assert released == 1
    assert held == HELD + 1


# ------------------------------------------------------------------ without the index


@pytest.fixture(scope="module")
def unique_0001_url(pg_server: Server) -> Iterator[Any]:
    targets = ("sa_jobs_core@head", "sajobs_unique_0001")
    with migrated_database(pg_server, "sa_jobs_unique_0001", *targets) as url:
        yield url


def test_a_database_without_the_ttl_index_still_releases_expired_locks(
    unique_0001_url: Any,
) -> None:
    with engine_at(unique_0001_url) as engine:
        with engine.connect() as connection:
            assert not _has_index(connection, "sa_job_unique_ttl_idx")
        ttl = UniqueOpts(by_args=True, ttl=HOUR)

        def insert() -> tuple[int, bool]:
            return insert_through(engine, "insert", Account(1), unique=ttl)

        old, _ = insert()
        expire_ttl_locks(engine, [old])  # its lock expired an hour ago
        new, skipped = insert()
        assert new != old and not skipped
        assert insert() == (new, True)


def _has_index(connection: Connection, name: str) -> bool:
    return bool(
        connection.scalar(text("SELECT count(*) FROM pg_indexes WHERE indexname = :n"), {"n": name})
    )
