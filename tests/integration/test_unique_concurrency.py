"""Unique jobs under contention: 16 threads, each with its own connection, released at once.

Every thread inserts the same overlapping keys, through every insert path (one job per
transaction, or a whole batch in one statement), in its own order. The database must
end with exactly one job holding each key, every thread must be told about that job,
and exactly one insert per key may report a new job. The same holds when the key is held
by a job whose TTL has passed (the racers queue on that job's lock and one replaces it),
and when the holder has just started with ``until="start"``.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import UniqueOpts
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import expire_ttl_locks
from tests.helpers import count_jobs

T = TypeVar("T")

THREADS = 16
KEYS = 8
PATHS = ["insert", "insert_many", "enqueue", "insert_job"]


@sa_jobs.job_args(kind="test_unique_concurrency.account")
class Account:
    account_id: int = sa_jobs.field(unique=True)
    thread: int = 0


BY_ARGS = UniqueOpts(by_args=True)
TTL = UniqueOpts(by_args=True, ttl=dt.timedelta(hours=1))
UNTIL_START = UniqueOpts(by_args=True, until="start")

#: ``(account_id, job id, skipped)`` for each insert one thread made.
Outcomes = list[tuple[int, int, bool]]


def race(engine: Engine, work: Callable[[int, Connection], T]) -> list[T]:
    """Run ``work(thread index, its own connection)`` in 16 threads released together."""
    barrier = threading.Barrier(THREADS)
    results: list[Any] = [None] * THREADS
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))  # connected before the start line
                connection.commit()
                barrier.wait(timeout=30)
                results[index] = work(index, connection)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def insert_keys(
    connection: Connection, path: str, accounts: list[int], thread: int, unique: UniqueOpts
) -> Outcomes:
    """Insert one job per account through ``path``; batches in one statement."""
    outcomes: Outcomes = []
    if path in ("insert", "insert_job"):
        for account in accounts:  # one transaction per job
            with Session(bind=connection) as session, session.begin():
                args = Account(account, thread)
                if path == "insert":
                    result = sa_jobs.insert(session, args, unique=unique)
                    job_id, skipped = result.job.id, result.unique_skipped_as_duplicate
                else:
                    row = session.execute(sa_jobs.insert_job(args, unique=unique)).one()
                    job_id, skipped = row.id, row.unique_skipped_as_duplicate
            outcomes.append((account, job_id, skipped))
        return outcomes
    with Session(bind=connection, expire_on_commit=False) as session, session.begin():
        batch = [Account(account, thread) for account in accounts]
        if path == "insert_many":
            results = sa_jobs.insert_many(session, batch, unique=unique)
            pairs = [(r.job.id, r.unique_skipped_as_duplicate) for r in results]
        else:
            jobs = [sa_jobs.enqueue(args, unique=unique) for args in batch]
            session.add_all(jobs)
            session.flush()
            pairs = [(job.id, job.unique_skipped_as_duplicate) for job in jobs]
    return [(a, job_id, skipped) for a, (job_id, skipped) in zip(accounts, pairs, strict=True)]


def racing_inserts(
    unique: UniqueOpts, *, shuffle_batches: bool = False
) -> Callable[[int, Connection], Outcomes]:
    """Each thread inserts every key through one path, one job per transaction in its own
    order; batches (one statement for all keys) go in key order unless ``shuffle_batches``.
    """

    def work(index: int, connection: Connection) -> Outcomes:
        path = PATHS[index % len(PATHS)]
        accounts = list(range(KEYS))
        if shuffle_batches or path in ("insert", "insert_job"):
            random.Random(index).shuffle(accounts)
        return insert_keys(connection, path, accounts, index, unique)

    return work


def holders_by_account(engine: Engine) -> dict[int, list[int]]:
    """Ids of the jobs holding a key (in the unique index), per account."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT (args->>'account_id')::int AS account, id FROM sa_job "
                "WHERE unique_key IS NOT NULL "
                "AND sa_job_state_in_bitmask(unique_states, state) ORDER BY id"
            )
        ).all()
    found: dict[int, list[int]] = {}
    for account, job_id in rows:
        found.setdefault(account, []).append(job_id)
    return found


def assert_one_winner_per_key(outcomes: list[Outcomes], holders: dict[int, list[int]]) -> None:
    assert sorted(holders) == list(range(KEYS))
    assert all(len(ids) == 1 for ids in holders.values()), holders
    new = Counter(account for thread in outcomes for account, _, skipped in thread if not skipped)
    assert new == Counter(range(KEYS)), "exactly one insert per key reports a new job"
    for thread in outcomes:
        assert len(thread) == KEYS
        for account, job_id, _ in thread:
            assert job_id == holders[account][0], "every thread is told about the winner"


@pytest.mark.parametrize("attempt", range(3))
def test_racing_inserters_leave_exactly_one_job_per_key(engine: Engine, attempt: int) -> None:
    # Every path at once: four threads each of insert, insert_job, insert_many, enqueue.
    outcomes = race(engine, racing_inserts(BY_ARGS))
    assert_one_winner_per_key(outcomes, holders_by_account(engine))
    assert count_jobs(engine) == KEYS


def test_racing_batches_in_different_orders_do_not_deadlock(engine: Engine) -> None:
    outcomes = race(engine, racing_inserts(BY_ARGS, shuffle_batches=True))
    assert_one_winner_per_key(outcomes, holders_by_account(engine))
    assert count_jobs(engine) == KEYS


def test_racing_inserters_replace_an_expired_holder_exactly_once(engine: Engine) -> None:
    # Each key is held by a job whose TTL has passed.
    with Session(engine, expire_on_commit=False) as session, session.begin():
        expired = sa_jobs.insert_many(session, [Account(a) for a in range(KEYS)], unique=TTL)
    expired_ids = {result.job.id for result in expired}
    expire_ttl_locks(engine, list(expired_ids))
    assert sorted(holders_by_account(engine)) == list(range(KEYS))

    outcomes = race(engine, racing_inserts(TTL))
    holders = holders_by_account(engine)
    assert_one_winner_per_key(outcomes, holders)
    assert not expired_ids & {ids[0] for ids in holders.values()}
    assert count_jobs(engine) == 2 * KEYS
    with engine.connect() as connection:
        released = connection.execute(
            text("SELECT count(*) FROM sa_job WHERE unique_key IS NULL")
        ).scalar_one()
    assert released == KEYS  # the expired holders let go, and nothing else did


def test_racing_inserters_after_until_start_holders_started(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Account(a) for a in range(KEYS)], unique=UNTIL_START)
    started = fetch_jobs(engine, "default", KEYS, "test-concurrency")
    assert len(started) == KEYS
    assert holders_by_account(engine) == {}

    outcomes = race(engine, racing_inserts(UNTIL_START))
    assert_one_winner_per_key(outcomes, holders_by_account(engine))
    assert count_jobs(engine) == 2 * KEYS


def test_racing_inserters_and_fetchers_of_until_start_jobs(engine: Engine) -> None:
    """Half the threads start jobs while the other half insert duplicates.

    A duplicate gets in only once the key's holder has started; the new job may itself be
    started by a fetcher and replaced in turn. Whatever the interleaving, at most one job
    per key holds it, and every other job of the key has started (and let go of it).
    """
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Account(a) for a in range(KEYS)], unique=UNTIL_START)
    originals = set(range(1, KEYS + 1))

    def work(index: int, connection: Connection) -> Outcomes:
        if index % 2:
            for _ in range(2):
                fetch_jobs(engine, "default", 1, f"fetcher-{index}")
            return []
        return racing_inserts(UNTIL_START)(index, connection)

    outcomes = race(engine, work)
    with engine.connect() as connection:
        jobs = connection.execute(
            text(
                "SELECT id, (args->>'account_id')::int AS account, state::text AS state, "
                "unique_key IS NOT NULL AND sa_job_state_in_bitmask(unique_states, state) "
                "AS holds, unique_key IS NULL AS released FROM sa_job ORDER BY id"
            )
        ).all()
    by_id = {job.id: job for job in jobs}
    for account in range(KEYS):
        mine = [job for job in jobs if job.account == account]
        assert sum(job.holds for job in mine) <= 1, mine
        for job in mine:
            if not job.holds:
                assert job.state == "running" and job.released, job
    new = [job_id for thread in outcomes for _, job_id, skipped in thread if not skipped]
    assert len(new) == len(set(new)), "each new job is reported once"
    assert not originals & set(new)
    assert len(jobs) == KEYS + len(new)
    for thread in outcomes:
        for account, job_id, _ in thread:
            assert by_id[job_id].account == account
