"""Unique jobs against a real database, on every insert path.

Each section follows one point of the feature: the options (by_args, a marked subset,
by_period, by_queue, by_state, exclude_kind, an empty UniqueOpts), one ``INSERT … ON
CONFLICT`` per path with in-batch folding, the retryable-excluded conflict and the
manual retry, ``ttl`` and ``until="start"``, and a database without the unique branch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertManyParams, InsertOpts, Job, JobState, UniqueOpts
from sa_jobs._base.states import FINAL_STATES, UNIQUE_CONFLICT_KEY
from sa_jobs._declare.options import DEFAULT_UNIQUE_STATES, REQUIRED_UNIQUE_STATES
from sa_jobs._table.models import states_bitmask
from sa_jobs._table.schema import CORE_BRANCH, UNIQUE_BRANCH, installed_branches
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import (
    InvalidOptionsError,
    JobStateError,
    SchemaMissingError,
    UniqueConflictError,
)
from sa_jobs.testing import canonical_unique_key
from sa_jobs.worker.maintenance.scheduler import Scheduler
from tests.factories import clear_workers_and_leader, expire_ttl_locks, job_row
from tests.helpers import (
    INSERT_PATHS,
    NO_DELAY,
    count_jobs,
    db_now,
    engine_at,
    fail_run,
    fetch_one,
    finish_run,
    get_job,
    insert_one,
    insert_through,
    make_worker,
    run_once,
    wait_past,
)


@sa_jobs.job_args(kind="test_unique.account")
class Account:
    account_id: int = sa_jobs.field(unique=True)
    trace_id: str = ""


@sa_jobs.job_args(kind="test_unique.other_account")
class OtherAccount:
    account_id: int = 0


@sa_jobs.job_args(kind="test_unique.daily", unique=UniqueOpts(by_args=True))
class Daily:
    n: int = 0


BY_ARGS = UniqueOpts(by_args=True)
#: by_state without retryable (and without the final states but completed).
NO_RETRYABLE = UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES | {JobState.COMPLETED})
#: Short enough to wait out, long enough that the next statement runs before it passes.
SHORT_TTL = dt.timedelta(seconds=1)  # the shortest TTL Faktory (and sa_jobs) allows
HOUR = dt.timedelta(hours=1)

PATHS = list(INSERT_PATHS)


# ------------------------------------------------------------------ helpers


def add_new(engine: Engine, args: object, **options: Any) -> int:
    """Insert one job that must not be a duplicate; returns its id."""
    result = insert_one(engine, args, **options)
    assert not result.unique_skipped_as_duplicate, f"expected a new job for {args!r}"
    return result.job.id


def rows(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT id, kind, state, unique_key FROM sa_job ORDER BY id")
        ).all()


def holders(engine: Engine) -> list[int]:
    """Ids of the jobs in the unique index (holding their key), in id order."""
    with engine.connect() as connection:
        return list(
            connection.scalars(
                text(
                    "SELECT id FROM sa_job WHERE unique_key IS NOT NULL "
                    "AND sa_job_state_in_bitmask(unique_states, state) ORDER BY id"
                )
            )
        )


def set_state(engine: Engine, job_id: int, state: JobState) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE sa_job SET state = CAST(:state AS sa_job_state), finalized_at = "
                "CASE WHEN :final THEN now() END WHERE id = :id"
            ),
            {
                "state": state.value,
                "final": state in FINAL_STATES,
                "id": job_id,
            },
        )


def promote(engine: Engine) -> int:
    """One scheduler pass: due scheduled and retryable jobs become available (or are
    discarded when another job took their key meanwhile)."""
    return run_once(engine, Scheduler())


def _in(delta: dt.timedelta) -> dt.datetime:
    """A time ``delta`` from now (positive: the future)."""
    return dt.datetime.now(dt.UTC) + delta


def wait_until_expired(engine: Engine, job_id: int) -> None:
    """Wait until the database clock has passed the job's TTL deadline."""
    expires_at = job_row(engine, job_id).unique_expires_at
    assert expires_at is not None
    wait_past(engine, expires_at)


# ------------------------------------------------------------------ 1. options, every path


@pytest.mark.parametrize("path", PATHS)
def test_a_duplicate_is_skipped_and_returns_the_existing_job(engine: Engine, path: str) -> None:
    first, skipped = insert_through(engine, path, Account(1, "a"), unique=BY_ARGS)
    assert not skipped
    # Only the marked field counts: another trace id is still a duplicate.
    again, skipped = insert_through(engine, path, Account(1, "b"), unique=BY_ARGS)
    assert (again, skipped) == (first, True)
    other, skipped = insert_through(engine, path, Account(2, "a"), unique=BY_ARGS)
    assert other != first and not skipped
    assert [row.id for row in rows(engine)] == [first, other]
    # The stored key is the SHA-256 of the documented canonical bytes.
    canonical = canonical_unique_key(Account(1, "zzz"), unique=BY_ARGS)
    assert canonical is not None
    assert job_row(engine, first).unique_key == hashlib.sha256(canonical).digest()


@pytest.mark.parametrize("path", PATHS)
def test_a_duplicate_in_the_same_transaction_is_skipped(engine: Engine, path: str) -> None:
    with Session(engine) as session, session.begin():
        first, skipped_first = insert_through(session, path, Account(1), unique=BY_ARGS)
        again, skipped_again = insert_through(session, path, Account(1), unique=BY_ARGS)
    assert (skipped_first, skipped_again) == (False, True)
    assert again == first
    assert len(rows(engine)) == 1


def test_the_skipped_result_carries_the_existing_row(engine: Engine) -> None:
    first = add_new(engine, Account(1, "original"), unique=BY_ARGS, queue="q1", priority=3)
    with Session(engine) as session, session.begin():
        result = sa_jobs.insert(session, Account(1, "new"), unique=BY_ARGS, queue="q1")
        assert result.unique_skipped_as_duplicate
        assert result.job.id == first
        assert result.job.priority == 3
        assert result.job.args == Account(1, "original")
        job = sa_jobs.enqueue(Account(1, "new"), unique=BY_ARGS, queue="q1")
        session.add(job)
        session.flush()
        assert job.id == first and job.unique_skipped_as_duplicate
        assert job.args_json == {"account_id": 1, "trace_id": "original"}


@pytest.mark.parametrize("path", ["insert_many", "enqueue"])
def test_duplicates_within_one_batch_are_folded_first_wins(
    engine: Engine, path: str, statements: list[str]
) -> None:
    existing = add_new(engine, Account(9, "existing"), unique=BY_ARGS)
    batch = [Account(1, "a"), Account(2, "a"), Account(1, "b"), Account(9, "c"), Account(2, "c")]
    statements.clear()
    with Session(engine) as session, session.begin():
        if path == "insert_many":
            results = sa_jobs.insert_many(session, batch, unique=BY_ARGS)
            outcome = [(r.job.id, r.unique_skipped_as_duplicate) for r in results]
        else:
            jobs = [sa_jobs.enqueue(args, unique=BY_ARGS) for args in batch]
            session.add_all(jobs)
            session.flush()
            outcome = [(job.id, job.unique_skipped_as_duplicate) for job in jobs]
    inserts = [s for s in statements if "INSERT INTO sa_job" in s]
    assert len(inserts) == 1, "one batch, one statement"
    one, two = outcome[0][0], outcome[1][0]
    assert outcome == [(one, False), (two, False), (one, True), (existing, True), (two, True)]
    assert {row.id for row in rows(engine)} == {existing, one, two}
    assert job_row(engine, one).args == {"account_id": 1, "trace_id": "a"}


def test_insert_many_folds_by_key_whatever_each_items_options(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                InsertManyParams(Account(1), InsertOpts(unique=BY_ARGS)),
                InsertManyParams(Account(1), InsertOpts(unique=NO_RETRYABLE)),  # same key
                InsertManyParams(Account(1), InsertOpts(unique=UniqueOpts())),  # not unique
                InsertManyParams(Account(1), InsertOpts(unique=UniqueOpts(by_queue=True))),
            ],
        )
    flags = [r.unique_skipped_as_duplicate for r in results]
    assert flags == [False, True, False, False]
    assert results[1].job.id == results[0].job.id
    assert len({r.job.id for r in results}) == 3


def test_each_row_of_a_mixed_batch_stores_its_own_lock_settings(engine: Engine) -> None:
    # Default settings travel as absent fields (rows stay small); the statement must
    # still store each row's own, and nothing for a row that is not unique.
    ttl_at_start = UniqueOpts(by_args=True, ttl=HOUR, until="start")
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(
            session,
            [
                InsertManyParams(Account(1), InsertOpts(unique=BY_ARGS)),
                InsertManyParams(Account(2), InsertOpts(unique=NO_RETRYABLE)),
                InsertManyParams(Account(3), InsertOpts(unique=UniqueOpts())),
                InsertManyParams(Account(4), InsertOpts(unique=ttl_at_start)),
            ],
        )
    with engine.connect() as connection:
        stored = connection.execute(
            text(
                "SELECT unique_key IS NOT NULL, unique_states::text,"
                " unique_expires_at - scheduled_at, unique_until_start FROM sa_job"
                " ORDER BY args->>'account_id'"
            )
        ).all()
    assert [tuple(row) for row in stored] == [
        (True, states_bitmask(DEFAULT_UNIQUE_STATES), None, False),
        (True, states_bitmask(NO_RETRYABLE.states), None, False),
        (False, None, None, False),
        # With a ttl a completed job stops blocking (Faktory): completed is left out.
        (True, states_bitmask(DEFAULT_UNIQUE_STATES - {JobState.COMPLETED}), HOUR, True),
    ]


def test_insert_many_across_batches_meets_the_earlier_batch_in_the_database(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session, [Account(1), Account(2), Account(1), Account(2)], unique=BY_ARGS, batch_size=2
        )
    assert [r.unique_skipped_as_duplicate for r in results] == [False, False, True, True]
    assert [r.job.id for r in results[2:]] == [r.job.id for r in results[:2]]


@pytest.mark.parametrize("path", PATHS)
def test_by_period_buckets_scheduled_at_from_the_epoch(engine: Engine, path: str) -> None:
    opts = UniqueOpts(by_args=True, by_period=dt.timedelta(minutes=15))

    def at(minute: int) -> dt.datetime:
        # Past times: the jobs are available at once; the bucket comes from scheduled_at.
        return dt.datetime(2020, 6, 1, 15, minute, tzinfo=dt.UTC)

    first, _ = insert_through(engine, path, Account(1), unique=opts, scheduled_at=at(21))
    again = insert_through(engine, path, Account(1), unique=opts, scheduled_at=at(28))
    assert again == (first, True)
    tokyo = at(15).astimezone(dt.timezone(dt.timedelta(hours=9)))
    again = insert_through(engine, path, Account(1), unique=opts, scheduled_at=tokyo)
    assert again == (first, True)
    later, skipped = insert_through(engine, path, Account(1), unique=opts, scheduled_at=at(31))
    assert later != first and not skipped
    earlier, skipped = insert_through(engine, path, Account(1), unique=opts, scheduled_at=at(14))
    assert earlier not in (first, later) and not skipped


def test_by_period_without_scheduled_at_uses_the_insert_time(engine: Engine) -> None:
    # A ten-year period: both inserts fall in the same bucket (barring a decade boundary).
    opts = UniqueOpts(by_period=dt.timedelta(days=3650))
    first = add_new(engine, Account(1), unique=opts)
    assert insert_through(engine, "insert", Account(2), unique=opts) == (first, True)


@pytest.mark.parametrize("path", PATHS)
def test_by_queue(engine: Engine, path: str) -> None:
    opts = UniqueOpts(by_args=True, by_queue=True)
    first, _ = insert_through(engine, path, Account(1), unique=opts, queue="q1")
    second, skipped = insert_through(engine, path, Account(1), unique=opts, queue="q2")
    assert second != first and not skipped
    assert insert_through(engine, path, Account(1), unique=opts, queue="q1") == (first, True)
    # Without by_queue the queue does not matter.
    third, _ = insert_through(engine, path, Account(5), unique=BY_ARGS, queue="q1")
    assert insert_through(engine, path, Account(5), unique=BY_ARGS, queue="q2") == (third, True)


@pytest.mark.parametrize("state", list(JobState))
def test_default_by_state_blocks_in_every_state_but_cancelled_and_discarded(
    engine: Engine, state: JobState
) -> None:
    first = add_new(engine, Account(1), unique=BY_ARGS)
    set_state(engine, first, state)
    again, skipped = insert_through(engine, "insert", Account(1), unique=BY_ARGS)
    blocks = state not in (JobState.CANCELLED, JobState.DISCARDED)
    assert skipped is blocks
    assert (again == first) is blocks


def test_custom_by_state_without_completed_lets_a_new_job_in_after_completion(
    engine: Engine,
) -> None:
    opts = UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES | {JobState.RETRYABLE})
    first = add_new(engine, Account(1), unique=opts)
    job = fetch_one(engine)
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)
    assert finish_run(engine, job)
    second, skipped = insert_through(engine, "insert", Account(1), unique=opts)
    assert second != first and not skipped


def test_an_empty_by_state_means_the_default_states_as_in_river(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True, by_state=[])
    assert opts.by_state is None
    assert opts.states == DEFAULT_UNIQUE_STATES
    assert UniqueOpts(by_state=[]).is_empty  # nothing else set: no uniqueness, as in River
    first = add_new(engine, Account(1), unique=opts)
    set_state(engine, first, JobState.COMPLETED)  # completed still blocks, as by default
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)


def test_by_state_missing_required_states_is_refused_when_built_naming_them(
    engine: Engine,
) -> None:
    with pytest.raises(InvalidOptionsError, match=r"must include pending, scheduled:"):
        UniqueOpts(by_args=True, by_state=[JobState.AVAILABLE, JobState.RUNNING])
    with pytest.raises(InvalidOptionsError, match=r"must include available, pending, running"):
        UniqueOpts(by_state=["scheduled", "completed"])
    with pytest.raises(InvalidOptionsError, match="by_state"):
        UniqueOpts(by_state=["available", "pending", "running", "scheduled", "nonsense"])
    with pytest.raises(InvalidOptionsError, match=r"sa_jobs\.UniqueOpts"):
        InsertOpts(unique={"by_args": True})  # type: ignore[arg-type]
    assert rows(engine) == []


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_unique_opts_means_no_uniqueness(engine: Engine, path: str) -> None:
    first, _ = insert_through(engine, path, Account(1), unique=UniqueOpts())
    second, skipped = insert_through(engine, path, Account(1), unique=UniqueOpts())
    assert second != first and not skipped
    assert [row.unique_key for row in rows(engine)] == [None, None]


@pytest.mark.parametrize("path", PATHS)
def test_the_call_site_overrides_the_kind_default(engine: Engine, path: str) -> None:
    first, _ = insert_through(engine, path, Daily(1))
    assert insert_through(engine, path, Daily(1)) == (first, True)  # the kind's by_args
    # UniqueOpts() turns the kind's uniqueness off for this call.
    plain, skipped = insert_through(engine, path, Daily(1), unique=UniqueOpts())
    assert plain != first and not skipped
    # Other options make another key.
    by_queue, skipped = insert_through(engine, path, Daily(1), unique=UniqueOpts(by_queue=True))
    assert by_queue != first and not skipped
    again = insert_through(engine, path, Daily(2), unique=UniqueOpts(by_queue=True))
    assert again == (by_queue, True)


@pytest.mark.parametrize("path", PATHS)
def test_the_kind_is_part_of_the_key_unless_excluded(engine: Engine, path: str) -> None:
    first, _ = insert_through(engine, path, Account(1), unique=BY_ARGS)
    other, skipped = insert_through(engine, path, OtherAccount(1), unique=BY_ARGS)
    assert other != first and not skipped
    excluded = UniqueOpts(by_args=True, exclude_kind=True)
    shared, _ = insert_through(engine, path, Account(2), unique=excluded)
    assert insert_through(engine, path, OtherAccount(2), unique=excluded) == (shared, True)


@pytest.mark.parametrize("path", PATHS)
def test_a_skipped_duplicate_changes_nothing_in_the_existing_job(engine: Engine, path: str) -> None:
    excluded = UniqueOpts(by_args=True, exclude_kind=True)
    first, _ = insert_through(engine, path, Account(2, "t"), unique=excluded)
    before = job_row(engine, first)
    assert insert_through(engine, path, OtherAccount(2), unique=excluded) == (first, True)
    after = job_row(engine, first)
    assert after.kind == "test_unique.account"
    assert after._asdict() == before._asdict()


# ------------------------------------------------------------------ 4. retryable left out


def test_a_retrying_job_whose_key_was_taken_is_discarded_when_due(engine: Engine) -> None:
    retrying = add_new(engine, Account(1, "first"), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=3600) == [(retrying, JobState.RETRYABLE)]
    assert holders(engine) == []  # retryable is not one of its states
    duplicate, skipped = insert_through(engine, "insert", Account(1, "second"), unique=NO_RETRYABLE)
    assert not skipped
    assert promote(engine) == 0  # not due yet: nothing happens
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET scheduled_at = now() - interval '1 s' WHERE id = :id"),
            {"id": retrying},
        )
    assert promote(engine) == 0
    row = job_row(engine, retrying)
    assert row.state is JobState.DISCARDED
    assert row.finalized_at is not None
    conflict = row.metadata[UNIQUE_CONFLICT_KEY]
    assert conflict["key_held_by_job"] == duplicate
    assert dt.datetime.fromisoformat(conflict["discarded_at"]) <= db_now(engine)
    assert job_row(engine, duplicate).state is JobState.AVAILABLE
    assert holders(engine) == [duplicate]


def test_a_retrying_job_whose_key_is_free_is_promoted(engine: Engine) -> None:
    retrying = add_new(engine, Account(1), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=0)
    assert promote(engine) == 1
    assert job_row(engine, retrying).state is JobState.AVAILABLE
    assert holders(engine) == [retrying]
    assert UNIQUE_CONFLICT_KEY not in job_row(engine, retrying).metadata


def test_of_several_due_jobs_sharing_a_free_key_the_oldest_is_promoted(engine: Engine) -> None:
    older = add_new(engine, Account(1, "older"), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=0)
    newer = add_new(engine, Account(1, "newer"), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=0)
    assert holders(engine) == []
    assert promote(engine) == 1
    assert job_row(engine, older).state is JobState.AVAILABLE
    row = job_row(engine, newer)
    assert row.state is JobState.DISCARDED
    assert row.metadata[UNIQUE_CONFLICT_KEY]["key_held_by_job"] == older


def test_a_due_holder_is_promoted_even_when_an_older_due_job_wants_its_key(
    engine: Engine,
) -> None:
    retrying = add_new(engine, Account(1, "older"), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=3600)
    holder = add_new(engine, Account(1, "newer"), unique=NO_RETRYABLE, scheduled_at=_in(HOUR))
    assert job_row(engine, holder).state is JobState.SCHEDULED
    assert holders(engine) == [holder]
    with engine.begin() as connection:  # an hour passes
        connection.execute(text("UPDATE sa_job SET scheduled_at = scheduled_at - interval '2 h'"))
    promote(engine)
    assert job_row(engine, holder).state is JobState.AVAILABLE
    assert job_row(engine, retrying).state is JobState.DISCARDED
    assert job_row(engine, retrying).metadata[UNIQUE_CONFLICT_KEY]["key_held_by_job"] == holder
    assert holders(engine) == [holder]


def test_retry_job_of_a_finished_job_whose_key_is_taken_is_a_clear_error(
    engine: Engine,
) -> None:
    finished = add_new(engine, Account(1), unique=BY_ARGS, max_attempts=1)
    assert fail_run(engine, fetch_one(engine), delay=0) == [(finished, JobState.DISCARDED)]
    holder = add_new(engine, Account(1), unique=BY_ARGS)
    with Session(engine) as session, session.begin():
        with pytest.raises(UniqueConflictError) as caught:
            sa_jobs.retry_job(session, finished)
        assert caught.value.job_id == finished
        assert caught.value.holder_id == holder
        assert f"held by job {holder}" in str(caught.value)
        # The transaction is still usable: more work in it commits.
        assert count_jobs(session) == 2
        extra = sa_jobs.insert(session, Account(2), unique=BY_ARGS).job.id
    assert job_row(engine, finished).state is JobState.DISCARDED
    assert job_row(engine, extra).state is JobState.AVAILABLE


def test_retry_job_of_a_completed_job_outside_its_states(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES)
    done = add_new(engine, Account(1), unique=opts)
    assert finish_run(engine, fetch_one(engine))
    holder = add_new(engine, Account(1), unique=opts)
    with Session(engine) as session, session.begin(), pytest.raises(UniqueConflictError):
        sa_jobs.retry_job(session, done)
    # Once the holder has finished, the retry goes through and retakes the key.
    assert finish_run(engine, fetch_one(engine))
    with Session(engine) as session, session.begin():
        assert sa_jobs.retry_job(session, done).state is JobState.AVAILABLE
    assert holders(engine) == [done]
    assert holder not in holders(engine)


def test_retry_job_of_a_retryable_job_without_retryable_in_its_states(engine: Engine) -> None:
    retrying = add_new(engine, Account(1), unique=NO_RETRYABLE)
    assert fail_run(engine, fetch_one(engine), delay=3600)
    holder = add_new(engine, Account(1), unique=NO_RETRYABLE)
    with Session(engine) as session, session.begin():
        with pytest.raises(UniqueConflictError) as caught:
            sa_jobs.retry_job(session, retrying)
        assert caught.value.holder_id == holder
    assert job_row(engine, retrying).state is JobState.RETRYABLE


def test_retry_job_of_a_running_job_is_refused(engine: Engine) -> None:
    add_new(engine, Account(1), unique=BY_ARGS)
    job = fetch_one(engine)
    with Session(engine) as session, session.begin(), pytest.raises(JobStateError):
        sa_jobs.retry_job(session, job.id)


# ------------------------------------------------------------------ 5. ttl


@pytest.mark.parametrize("path", PATHS)
def test_a_ttl_lock_stops_blocking_after_it_expires(engine: Engine, path: str) -> None:
    opts = UniqueOpts(by_args=True, ttl=SHORT_TTL)
    first, _ = insert_through(engine, path, Account(1), unique=opts)
    assert insert_through(engine, path, Account(1), unique=opts) == (first, True)
    wait_until_expired(engine, first)
    second, skipped = insert_through(engine, path, Account(1), unique=opts)
    assert second != first and not skipped
    # The old job is still available (unfinished); it has let go of its key.
    old = job_row(engine, first)
    assert old.state is JobState.AVAILABLE
    assert old.unique_key is None
    assert holders(engine) == [second]
    assert insert_through(engine, path, Account(1), unique=opts) == (second, True)


@pytest.mark.parametrize("path", PATHS)
def test_a_back_dated_scheduled_at_does_not_shorten_the_ttl_lock(engine: Engine, path: str) -> None:
    # Faktory counts unique_for from now, or from the scheduled time when that is later.
    # Counted from a scheduled_at two hours ago, an hour's lock expired before the
    # insert returned and the duplicate was accepted at once.
    opts = UniqueOpts(by_args=True, ttl=HOUR)
    before = db_now(engine)
    first, _ = insert_through(engine, path, Account(1), unique=opts, scheduled_at=_in(-2 * HOUR))
    after = db_now(engine)
    assert insert_through(engine, path, Account(1), unique=opts) == (first, True)
    expires_at = job_row(engine, first).unique_expires_at
    assert before + HOUR <= expires_at <= after + HOUR


def test_a_scheduled_jobs_delay_counts_toward_its_ttl(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True, ttl=SHORT_TTL)
    scheduled_at = _in(HOUR)
    first = add_new(engine, Account(1), unique=opts, scheduled_at=scheduled_at)
    row = job_row(engine, first)
    assert row.state is JobState.SCHEDULED
    assert row.unique_expires_at == scheduled_at + SHORT_TTL
    wait_past(engine, row.created_at + SHORT_TTL)  # the TTL alone would have passed
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)
    # When scheduled_at + ttl has passed, the lock is gone.
    expire_ttl_locks(engine, [first])
    second, skipped = insert_through(engine, "insert", Account(1), unique=opts)
    assert second != first and not skipped


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RETRYABLE, JobState.RUNNING])
def test_a_ttl_lock_expires_even_while_the_job_is_unfinished(
    engine: Engine, state: JobState
) -> None:
    opts = UniqueOpts(by_args=True, ttl=HOUR)
    first = add_new(engine, Account(1), unique=opts)
    set_state(engine, first, state)
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)
    expire_ttl_locks(engine, [first])
    second, skipped = insert_through(engine, "insert", Account(1), unique=opts)
    assert second != first and not skipped
    assert job_row(engine, first).state is state
    assert holders(engine) == [second]


def test_with_a_ttl_a_completed_job_no_longer_blocks(engine: Engine) -> None:
    # Faktory: "a second job can be pushed after the TTL or after the first job has
    # successfully processed".
    opts = UniqueOpts(by_args=True, ttl=HOUR)
    first = add_new(engine, Account(1), unique=opts)
    set_state(engine, first, JobState.COMPLETED)
    second, skipped = insert_through(engine, "insert", Account(1), unique=opts)
    assert second != first and not skipped
    # Running or retrying, it still holds the lock.
    set_state(engine, second, JobState.RETRYABLE)
    assert insert_through(engine, "insert", Account(1), unique=opts) == (second, True)


def test_with_a_ttl_an_explicit_by_state_still_decides(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True, ttl=HOUR, by_state=list(DEFAULT_UNIQUE_STATES))
    first = add_new(engine, Account(1), unique=opts)
    set_state(engine, first, JobState.COMPLETED)
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)


@pytest.mark.parametrize("option", ["ttl", "by_period"])
def test_a_ttl_or_period_under_a_second_is_refused(option: str) -> None:
    with pytest.raises(InvalidOptionsError, match="at least 1 second") as caught:
        UniqueOpts(by_args=True, **{option: dt.timedelta(milliseconds=999)})
    assert caught.value.option == option


def test_a_retrying_job_keeps_its_ttl_lock_until_it_expires(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True, ttl=SHORT_TTL)
    first = add_new(engine, Account(1), unique=opts)
    assert fail_run(engine, fetch_one(engine), delay=3600)
    # Held through the retry:
    assert insert_through(engine, "insert", Account(1), unique=opts) == (first, True)
    wait_until_expired(engine, first)
    second, skipped = insert_through(engine, "insert", Account(1), unique=opts)
    assert second != first and not skipped
    assert job_row(engine, first).state is JobState.RETRYABLE


# ------------------------------------------------------------------ 5. until="start"

UNTIL_START = UniqueOpts(by_args=True, until="start")


@pytest.mark.parametrize("path", PATHS)
def test_until_start_releases_the_key_when_the_job_starts(engine: Engine, path: str) -> None:
    first, _ = insert_through(engine, path, Account(1), unique=UNTIL_START)
    assert insert_through(engine, path, Account(1), unique=UNTIL_START) == (first, True)
    job = fetch_one(engine)
    assert job.id == first
    second, skipped = insert_through(engine, path, Account(1), unique=UNTIL_START)
    assert second != first and not skipped
    assert job_row(engine, first).unique_key is None
    assert holders(engine) == [second]


def test_until_start_a_retry_never_retakes_the_key(engine: Engine) -> None:
    first = add_new(engine, Account(1), unique=UNTIL_START, max_attempts=3)
    assert fail_run(engine, fetch_one(engine), delay=0)  # released at start, now retryable
    assert holders(engine) == []
    assert promote(engine) == 1  # promoted without any conflict
    assert job_row(engine, first).state is JobState.AVAILABLE
    assert job_row(engine, first).unique_key is None
    second, skipped = insert_through(engine, "insert", Account(1), unique=UNTIL_START)
    assert not skipped
    # The first job runs again and fails again; the second one keeps the key.
    assert fetch_one(engine).id == first
    assert fail_run(engine, get_job(engine, first), delay=0)
    with Session(engine) as session, session.begin():
        sa_jobs.retry_job(session, first)  # a manual retry does not retake it either
    assert holders(engine) == [second]
    assert job_row(engine, first).unique_key is None


def test_until_start_with_a_worker(engine: Engine) -> None:
    clear_workers_and_leader(engine)
    seen: list[tuple[str, bool]] = []
    first = add_new(engine, Account(1, "original"), unique=UNTIL_START, queue="until_start")
    worker = make_worker(engine, queues={"until_start": 1}, retry_policy=NO_DELAY)

    @worker.handler(Account)
    def handle(job: Job, session: Session) -> None:
        if job.args.trace_id == "original":
            # While this job runs, a duplicate is accepted.
            result = sa_jobs.insert(
                session, Account(1, "during"), unique=UNTIL_START, queue="until_start"
            )
            seen.append(("during", result.unique_skipped_as_duplicate))
        else:
            seen.append((job.args.trace_id, False))

    worker.run_until_idle(timeout=30)
    assert seen == [("during", False), ("during", False)]
    assert job_row(engine, first).state is JobState.COMPLETED
    assert holders(engine) == []


# ------------------------------------------------------------------ without the unique branch


def test_migrate_to_the_core_branch_alone(pg_server: Server) -> None:
    with (
        throwaway_database(pg_server, prefix="sa_jobs_core_target") as url,
        engine_at(url) as engine,
    ):
        sa_jobs.migrate(engine, "sa_jobs_core@head")
        with engine.connect() as connection:
            assert installed_branches(connection) == {CORE_BRANCH}


def test_the_core_only_database_has_no_unique_branch(core_only: Engine) -> None:
    with core_only.connect() as connection:
        assert installed_branches(connection) == {CORE_BRANCH}


UNIQUE_INSERTS: dict[str, Callable[[Session], object]] = {
    "insert": lambda session: sa_jobs.insert(session, Account(1), unique=BY_ARGS),
    "insert_many": lambda session: sa_jobs.insert_many(session, [Account(1)], unique=BY_ARGS),
    "enqueue": lambda session: (
        session.add(sa_jobs.enqueue(Account(1), unique=BY_ARGS)),
        session.flush(),
    ),
    "kind_default": lambda session: sa_jobs.insert(session, Daily(1)),
}


@pytest.mark.parametrize("path", list(UNIQUE_INSERTS))
def test_a_unique_insert_without_the_unique_branch_names_the_branch(
    core_only: Engine, path: str
) -> None:
    # The exception leaves the session's transaction, which rolls back.
    with (
        pytest.raises(SchemaMissingError) as caught,
        Session(core_only) as session,
        session.begin(),
    ):
        UNIQUE_INSERTS[path](session)
    assert caught.value.branch == UNIQUE_BRANCH
    assert "sa_jobs_unique" in str(caught.value)


def test_plain_jobs_and_a_worker_work_without_the_unique_branch(core_only: Engine) -> None:
    with Session(core_only) as session, session.begin():
        sa_jobs.insert(session, Account(1))
        sa_jobs.insert_many(session, [Account(2), Account(2)])
        session.add(sa_jobs.enqueue(Account(3)))
        session.execute(sa_jobs.insert_job(Account(4), unique=UniqueOpts()))
    done: list[int] = []
    worker = make_worker(core_only)

    @worker.handler(Account)
    def handle(job: Job) -> None:
        done.append(job.args.account_id)

    worker.run_until_idle(timeout=30)
    assert sorted(done) == [1, 2, 2, 3, 4]
    with core_only.connect() as connection:
        states = connection.scalars(text("SELECT DISTINCT state::text FROM sa_job")).all()
    assert states == ["completed"]
