"""Unique inserts against a table full of held keys: the work is per key inserted.

Before each unique insert takes its keys, it releases those held under an expired TTL
(``release_expired_locks``). These tests read the plan PostgreSQL actually ran (``EXPLAIN
ANALYZE`` of the very statement and parameters an insert sent) and check how many rows of
``sa_job`` it touched: a handful, not one per key already in the table. They also check
that the step is skipped outright while no TTL lock has expired, and that a database
without ``sa_job_unique_ttl_idx`` (the unique branch's first revision only) still works.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertManyParams, UniqueOpts
from sa_jobs.devdb import Server, throwaway_database

BY_ARGS = UniqueOpts(by_args=True)
HOUR = dt.timedelta(hours=1)
#: Keys already held in the table; enough that reading them all is unmistakable.
HELD = 4000
#: How many rows of sa_job one plan node may touch for a batch of a few keys.
PER_NODE_LIMIT = 50


@sa_jobs.job_args(kind="test_unique_scale.account", unique=BY_ARGS)
class Account:
    account_id: int = 0


def hold_keys(engine: Engine, *, ttl: dt.timedelta | None, expired: bool = False) -> None:
    """Fill the table with HELD jobs holding keys 0..HELD-1 (under a TTL if ``ttl``)."""
    unique = UniqueOpts(by_args=True, ttl=ttl)
    scheduled_at = dt.datetime.now(dt.UTC) - 2 * HOUR if expired else None
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(
            session,
            [Account(n) for n in range(HELD)],
            unique=unique,
            scheduled_at=scheduled_at,
        )


def explain_insert(engine: Engine, insert: Callable[[Session], Any]) -> dict[str, Any]:
    """The plan (EXPLAIN ANALYZE, JSON) of the INSERT that ``insert`` sends.

    The insert runs once to capture its SQL and parameters as sent to the driver, and
    the EXPLAIN runs them again; both in transactions that roll back.
    """
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().startswith(("WITH", "INSERT")) and "sa_job" in statement:
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        with Session(engine) as session, session.begin():
            insert(session)
            session.rollback()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    ((statement, parameters),) = sent
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).scalar_one()
        connection.rollback()
    root: dict[str, Any] = plan[0]["Plan"]
    return root


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


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
            for n in nodes(plan)
            if reads_sa_job(n)
        ),
        reverse=True,
    )


def release_step(plan: dict[str, Any]) -> dict[str, Any]:
    (cte,) = [n for n in nodes(plan) if n.get("Subplan Name") == "CTE released_unique_keys"]
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
    executed = [n for n in nodes(step) if n.get("Actual Loops", 0) > 0]
    # Only the guard ran: one lookup in the index of TTL holders, which found nothing.
    guard = [n for n in executed if reads_sa_job(n)]
    assert [n.get("Index Name") for n in guard] == ["sa_job_unique_ttl_idx"]
    assert [rows_touched(n) for n in guard] == [0]
    # The batch's keys (read from the parsed rows) are never even looked at.
    batch_reads = [n for n in nodes(step) if n["Node Type"] in ("CTE Scan", "Function Scan")]
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
    with throwaway_database(pg_server, prefix="sa_jobs_unique_0001") as url:
        engine = create_engine(url)
        sa_jobs.migrate(engine, "sajobs_unique_0001")
        engine.dispose()
        yield url


def test_a_database_without_the_ttl_index_still_releases_expired_locks(
    unique_0001_url: Any,
) -> None:
    engine = create_engine(unique_0001_url)
    try:
        with engine.connect() as connection:
            assert not _has_index(connection, "sa_job_unique_ttl_idx")
        past = dt.datetime.now(dt.UTC) - 2 * HOUR
        ttl = UniqueOpts(by_args=True, ttl=HOUR)

        def insert(**options: Any) -> tuple[int, bool]:
            with Session(engine) as session, session.begin():
                result = sa_jobs.insert(session, Account(1), unique=ttl, **options)
                return result.job.id, result.unique_skipped_as_duplicate

        old, _ = insert(scheduled_at=past)  # its lock expired an hour ago
        new, skipped = insert()
        assert new != old and not skipped
        assert insert() == (new, True)
    finally:
        engine.dispose()


def _has_index(connection: Connection, name: str) -> bool:
    return bool(
        connection.scalar(text("SELECT count(*) FROM pg_indexes WHERE indexname = :n"), {"n": name})
    )
