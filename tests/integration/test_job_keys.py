"""Job keys (Graphile Worker's ``job_key``), checked bullet by bullet against the seed.

The seed's algorithm, when a job is added with a key:

* no job holds the key → a new job;
* ``unsafe_dedupe`` → the existing job, untouched, even running or permanently failed;
* the holder is locked (running) → it loses the key and its remaining attempts, and a
  new job is created;
* the holder failed before (retryable with errors, or discarded) → attempt 0, errors
  cleared, every new value taken, ``scheduled_at`` included even under
  ``preserve_run_at``;
* ``preserve_run_at`` → every new value but ``scheduled_at``;
* ``replace`` → every new value.

Then the seed's examples (one ``send_email`` with count 2, merged ``process_invoices``,
the batching window, a non-array payload replacing), its caveats (a completed job's key is
free again, keys are universal across kinds, a running job that is replaced finishes but
never runs again — with a real worker), ``remove_job``, every insert path and its result,
option validation, and the ``sa_jobs_job_key`` migration branch.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import URL, Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import (
    InsertAction,
    InsertManyParams,
    InsertOpts,
    Job,
    JobKeyMode,
    JobState,
    SequenceOpts,
    UniqueOpts,
)
from sa_jobs._base.records import Ending
from sa_jobs._base.states import JOB_KEY_REPLACED_KEY
from sa_jobs._declare.options import DEFAULT_MAX_ATTEMPTS
from sa_jobs._insert.job_key import RemoveOutcome
from sa_jobs._table.schema import CORE_BRANCH, JOB_KEY_BRANCH, installed_branches
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import InvalidOptionsError, JobSnooze, JobStateError, SchemaMissingError
from sa_jobs.worker.maintenance.rescuer import Rescuer
from tests.factories import clear_workers_and_leader, job_row
from tests.helpers import (
    AN_HOUR,
    NO_DELAY,
    count_jobs,
    db_now,
    engine_at,
    fail_run,
    fetch_one,
    finish_run,
    insert_one,
    make_worker,
    wait_event,
    wait_for_state,
    wait_passes,
)

# ------------------------------------------------------------------ the jobs


@sa_jobs.job_args(kind="jk_send_email")
class SendEmail:
    count: int = 0


@sa_jobs.job_args(kind="jk_process_invoices", list_payload=True)
class ProcessInvoices:
    """Graphile's ``process_invoices``: the stored payload is the list itself."""

    invoices: list[dict[str, int]] = []


@sa_jobs.job_args(kind="jk_process_events", list_payload=True)
class ProcessEvents:
    events: list[int] = []


@sa_jobs.job_args(kind="jk_other", max_attempts=3)
class Other:
    n: int = 0


@sa_jobs.job_args(kind="jk_unique_kind", unique=UniqueOpts(by_args=True))
class UniqueKind:
    n: int = 0


@sa_jobs.job_args(kind="jk_sequenced_kind", sequence=SequenceOpts())
class SequencedKind:
    n: int = sa_jobs.field(default=0, sequence=True)


class Boom(Exception):
    pass


FAR = dt.timedelta(days=1)
KEY = "the-key"


# ------------------------------------------------------------------ helpers


def all_rows(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(text("SELECT * FROM sa_job ORDER BY id")))


def retryable_job(engine: Engine, args: object, **options: Any) -> int:
    """A keyed job that ran once and failed: retryable, one error, attempt 1."""
    job_id = insert_one(engine, args, job_key=KEY, max_attempts=5, **options).job.id
    job = fetch_one(engine)
    assert job.id == job_id
    assert fail_run(engine, job, delay=3600.0)
    assert job_row(engine, job_id).state == JobState.RETRYABLE.value
    return job_id


def discarded_job(engine: Engine, args: object, **options: Any) -> int:
    """A keyed job that failed its only attempt: discarded, and still holding its key."""
    job_id = insert_one(engine, args, job_key=KEY, max_attempts=1, **options).job.id
    job = fetch_one(engine)
    assert fail_run(engine, job, delay=3600.0)
    discarded = job_row(engine, job_id)
    assert discarded.state == JobState.DISCARDED.value
    assert discarded.job_key == KEY
    return job_id


def running_job(engine: Engine, args: object, **options: Any) -> Job:
    insert_one(engine, args, job_key=KEY, **options)
    return fetch_one(engine)


def holder_of(engine: Engine, key: str) -> Any:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM sa_job WHERE job_key = :k"), {"k": key})
        found = list(rows)
    assert len(found) <= 1
    return found[0] if found else None


def near(value: dt.datetime, expected: dt.datetime, seconds: float = 5.0) -> bool:
    return abs((value - expected).total_seconds()) <= seconds


# ------------------------------------------------------------------ the algorithm


def test_no_job_with_the_key_creates_a_new_job(engine: Engine) -> None:
    result = insert_one(engine, SendEmail(1), job_key=KEY)
    assert result.action is InsertAction.INSERTED
    assert result.unique_skipped_as_duplicate is False
    stored = job_row(engine, result.job.id)
    assert stored.job_key == KEY
    assert stored.state == JobState.AVAILABLE.value
    assert stored.args == {"count": 1}
    assert count_jobs(engine) == 1


@pytest.mark.parametrize("mode", list(JobKeyMode))
def test_every_mode_creates_a_job_when_the_key_is_free(engine: Engine, mode: JobKeyMode) -> None:
    result = insert_one(engine, SendEmail(1), job_key=KEY, job_key_mode=mode)
    assert result.action is InsertAction.INSERTED
    assert job_row(engine, result.job.id).job_key == KEY


def test_unsafe_dedupe_returns_the_unlocked_job_untouched(engine: Engine) -> None:
    later = db_now(engine) + FAR
    first = insert_one(engine, SendEmail(1), job_key=KEY, scheduled_at=later, priority=2)
    before = job_row(engine, first.job.id)
    second = insert_one(
        engine,
        SendEmail(2),
        job_key=KEY,
        job_key_mode=JobKeyMode.UNSAFE_DEDUPE,
        priority=4,
        queue="elsewhere",
    )
    assert second.action is InsertAction.DEDUPLICATED
    assert second.job.id == first.job.id
    assert second.job.args_json == {"count": 1}
    assert second.job.args == SendEmail(1)
    assert job_row(engine, first.job.id)._asdict() == before._asdict()
    assert count_jobs(engine) == 1


def test_unsafe_dedupe_returns_a_running_job_without_touching_it(engine: Engine) -> None:
    running = running_job(engine, SendEmail(1))
    before = job_row(engine, running.id)
    result = insert_one(engine, SendEmail(2), job_key=KEY, job_key_mode="unsafe_dedupe")
    assert result.action is InsertAction.DEDUPLICATED
    assert result.job.id == running.id
    after = job_row(engine, running.id)
    assert after._asdict() == before._asdict()
    assert after.job_key == KEY  # not detached
    assert after.max_attempts == before.max_attempts
    assert count_jobs(engine) == 1


@pytest.mark.parametrize("failed", ["retryable", "discarded"])
def test_unsafe_dedupe_returns_a_failed_job_without_resetting_it(
    engine: Engine, failed: str
) -> None:
    make = retryable_job if failed == "retryable" else discarded_job
    job_id = make(engine, ProcessEvents([1]))
    before = job_row(engine, job_id)
    mode = JobKeyMode.UNSAFE_DEDUPE
    result = insert_one(engine, ProcessEvents([2]), job_key=KEY, job_key_mode=mode)
    assert result.action is InsertAction.DEDUPLICATED
    assert result.job.id == job_id
    after = job_row(engine, job_id)
    assert after._asdict() == before._asdict()
    assert after.state == failed
    assert after.args == [1]  # not even merged
    assert len(after.errors) == 1


@pytest.mark.parametrize("mode", [JobKeyMode.REPLACE, JobKeyMode.PRESERVE_RUN_AT])
def test_a_locked_job_loses_its_key_and_attempts_and_a_new_job_is_created(
    engine: Engine, mode: JobKeyMode
) -> None:
    running = running_job(engine, ProcessEvents([1]), max_attempts=5)
    assert running.attempt == 1
    later = db_now(engine) + FAR
    result = insert_one(
        engine,
        ProcessEvents([2]),
        job_key=KEY,
        job_key_mode=mode,
        scheduled_at=later,
        priority=3,
        max_attempts=7,
    )
    assert result.action is InsertAction.INSERTED
    assert result.job.id != running.id
    old = job_row(engine, running.id)
    assert old.state == JobState.RUNNING.value  # it keeps running...
    assert old.job_key is None  # ...without its key...
    assert old.max_attempts == old.attempt == 1  # ...and without attempts to spare
    assert JOB_KEY_REPLACED_KEY in old.metadata
    assert old.args == [1]  # untouched otherwise
    new = job_row(engine, result.job.id)
    assert new.job_key == KEY
    assert new.args == [2]  # a new job: nothing merged from the running one
    assert new.state == JobState.SCHEDULED.value
    assert new.scheduled_at == later
    assert (new.priority, new.max_attempts, new.attempt) == (3, 7, 0)
    assert holder_of(engine, KEY).id == result.job.id


@pytest.mark.parametrize("mode", [JobKeyMode.REPLACE, JobKeyMode.PRESERVE_RUN_AT])
@pytest.mark.parametrize("due", ["now", "later"])
def test_a_failed_job_still_retrying_is_reset_as_graphile_resets_it(
    engine: Engine, mode: JobKeyMode, due: str
) -> None:
    job_id = retryable_job(engine, ProcessEvents([1]), priority=2, tags=["old"], metadata={"v": 1})
    before = job_row(engine, job_id)
    assert before.attempt == 1 and len(before.errors) == 1
    new_time = db_now(engine) + FAR if due == "later" else None
    result = insert_one(
        engine,
        Other(9),  # a different kind and an object payload: replaced, not merged
        job_key=KEY,
        job_key_mode=mode,
        scheduled_at=new_time,
        priority=4,
        max_attempts=6,
        queue="default",
        tags=["new"],
        metadata={"v": 2},
    )
    assert result.action is InsertAction.REPLACED
    assert result.job.id == job_id
    assert result.revision == 1
    after = job_row(engine, job_id)
    # Graphile's reset: attempts back to 0, errors cleared, max_attempts as given.
    assert (after.attempt, after.max_attempts, after.errors) == (0, 6, [])
    assert after.revision == 1
    assert after.finalized_at is None
    assert after.kind == "jk_other"
    assert after.args == {"n": 9}
    assert (after.priority, after.tags) == (4, ["new"])
    assert after.metadata == {"v": 2}
    assert after.job_key == KEY
    # scheduled_at is the new one, even under preserve_run_at.
    if new_time is None:
        assert after.state == JobState.AVAILABLE.value
        assert near(after.scheduled_at, db_now(engine))
        assert after.scheduled_at != before.scheduled_at
    else:
        assert after.state == JobState.SCHEDULED.value
        assert after.scheduled_at == new_time
    assert count_jobs(engine) == 1


@pytest.mark.parametrize("mode", [JobKeyMode.REPLACE, JobKeyMode.PRESERVE_RUN_AT])
def test_a_permanently_failed_job_keeps_its_history_and_a_new_job_takes_the_key(
    engine: Engine, mode: JobKeyMode
) -> None:
    # Graphile's SQL counts attempts >= max_attempts as unavailable, like a locked job:
    # the old row loses its key and a new job is created.
    job_id = discarded_job(engine, ProcessEvents([1]))
    before = job_row(engine, job_id)
    result = insert_one(engine, ProcessEvents([2]), job_key=KEY, job_key_mode=mode)
    assert result.action is InsertAction.INSERTED
    assert result.job.id != job_id
    assert result.revision == 0
    old = job_row(engine, job_id)
    assert old.state == JobState.DISCARDED.value
    assert old.job_key is None
    assert (old.attempt, old.max_attempts, old.errors) == (
        before.attempt,
        before.max_attempts,
        before.errors,
    )
    assert old.args == [1]  # no merge into a job that will never run
    assert holder_of(engine, KEY).id == result.job.id
    assert job_row(engine, result.job.id).args == [2]


def test_unsafe_dedupe_returns_a_permanently_failed_job_untouched(engine: Engine) -> None:
    job_id = discarded_job(engine, SendEmail(1))
    result = insert_one(engine, SendEmail(2), job_key=KEY, job_key_mode="unsafe_dedupe")
    assert (result.action, result.job.id) == (InsertAction.DEDUPLICATED, job_id)
    assert job_row(engine, job_id).state == JobState.DISCARDED.value


def test_a_failed_job_merges_array_payloads_when_reset(engine: Engine) -> None:
    job_id = retryable_job(engine, ProcessEvents([1]))
    result = insert_one(engine, ProcessEvents([2]), job_key=KEY, job_key_mode="preserve_run_at")
    assert result.action is InsertAction.REPLACED
    assert job_row(engine, job_id).args == [1, 2]
    assert result.job.args == ProcessEvents([1, 2])


def test_a_retried_job_that_failed_before_is_reset_too(engine: Engine) -> None:
    # Available again (retry_job keeps the errors), but it has failed before.
    job_id = retryable_job(engine, SendEmail(1))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.retry_job(session, job_id)
    assert job_row(engine, job_id).state == JobState.AVAILABLE.value
    later = db_now(engine) + FAR
    insert_one(
        engine, SendEmail(2), job_key=KEY, job_key_mode="preserve_run_at", scheduled_at=later
    )
    after = job_row(engine, job_id)
    # Reset: errors cleared, a full set of attempts (the counter itself never goes down).
    assert (after.errors, after.scheduled_at) == ([], later)
    assert after.max_attempts - after.attempt == DEFAULT_MAX_ATTEMPTS
    assert after.state == JobState.SCHEDULED.value


def test_preserve_run_at_keeps_scheduled_at_and_takes_every_other_value(engine: Engine) -> None:
    now = db_now(engine)
    first_time = now + dt.timedelta(hours=1)
    first = insert_one(
        engine,
        SendEmail(1),
        job_key=KEY,
        scheduled_at=first_time,
        priority=1,
        max_attempts=2,
        tags=["a"],
        metadata={"v": 1},
    )
    result = insert_one(
        engine,
        Other(2),
        job_key=KEY,
        job_key_mode=JobKeyMode.PRESERVE_RUN_AT,
        scheduled_at=now + dt.timedelta(hours=5),
        priority=4,
        max_attempts=9,
        queue="q2",
        tags=["b"],
        metadata={"v": 2},
    )
    assert result.action is InsertAction.REPLACED
    assert result.job.id == first.job.id
    after = job_row(engine, first.job.id)
    assert after.scheduled_at == first_time
    assert after.state == JobState.SCHEDULED.value
    assert (after.kind, after.args, after.queue) == ("jk_other", {"n": 2}, "q2")
    assert (after.priority, after.max_attempts, after.tags) == (4, 9, ["b"])
    assert after.metadata == {"v": 2}
    assert result.job.scheduled_at == first_time


def test_preserve_run_at_leaves_a_due_job_due(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    before = job_row(engine, first.job.id)
    later = db_now(engine) + FAR
    insert_one(
        engine, SendEmail(2), job_key=KEY, job_key_mode="preserve_run_at", scheduled_at=later
    )
    after = job_row(engine, first.job.id)
    assert after.scheduled_at == before.scheduled_at
    assert after.state == JobState.AVAILABLE.value
    assert after.args == {"count": 2}


def test_preserve_run_at_keeps_scheduled_at_when_no_new_time_is_given(engine: Engine) -> None:
    later = db_now(engine) + FAR
    first = insert_one(engine, SendEmail(1), job_key=KEY, scheduled_at=later)
    insert_one(engine, SendEmail(2), job_key=KEY, job_key_mode="preserve_run_at")
    after = job_row(engine, first.job.id)
    assert (after.scheduled_at, after.state) == (later, JobState.SCHEDULED.value)


def test_replace_takes_every_new_value_scheduled_at_included(engine: Engine) -> None:
    now = db_now(engine)
    first = insert_one(
        engine,
        SendEmail(1),
        job_key=KEY,
        scheduled_at=now + dt.timedelta(hours=1),
        priority=1,
        max_attempts=2,
        tags=["a"],
        metadata={"v": 1},
    )
    new_time = now + dt.timedelta(hours=5)
    result = insert_one(
        engine,
        Other(2),
        job_key=KEY,
        scheduled_at=new_time,
        priority=4,
        max_attempts=9,
        queue="q2",
        tags=["b"],
        metadata={"v": 2},
    )
    assert result.action is InsertAction.REPLACED
    assert result.job.id == first.job.id
    after = job_row(engine, first.job.id)
    assert after.scheduled_at == new_time
    assert (after.kind, after.args, after.queue) == ("jk_other", {"n": 2}, "q2")
    assert (after.priority, after.max_attempts, after.tags) == (4, 9, ["b"])
    assert after.metadata == {"v": 2}
    assert (after.attempt, after.errors) == (0, [])
    assert count_jobs(engine) == 1


def test_replace_moves_a_scheduled_job_to_now_and_back(engine: Engine) -> None:
    later = db_now(engine) + FAR
    first = insert_one(engine, SendEmail(1), job_key=KEY, scheduled_at=later)
    assert job_row(engine, first.job.id).state == JobState.SCHEDULED.value
    insert_one(engine, SendEmail(2), job_key=KEY)  # no scheduled_at: due now
    after = job_row(engine, first.job.id)
    assert after.state == JobState.AVAILABLE.value
    assert near(after.scheduled_at, db_now(engine))
    insert_one(engine, SendEmail(3), job_key=KEY, scheduled_at=later)  # and later again
    after = job_row(engine, first.job.id)
    assert (after.state, after.scheduled_at) == (JobState.SCHEDULED.value, later)


def test_replace_is_a_debounce_and_preserve_run_at_a_throttle(engine: Engine) -> None:
    now = db_now(engine)
    times = [now + dt.timedelta(seconds=10 * i) for i in range(1, 4)]
    debounced = [
        insert_one(engine, ProcessEvents([i]), job_key="debounce", scheduled_at=t)
        for i, t in enumerate(times)
    ]
    throttled = [
        insert_one(
            engine,
            ProcessEvents([i]),
            job_key="throttle",
            scheduled_at=t,
            job_key_mode="preserve_run_at",
        )
        for i, t in enumerate(times)
    ]
    debounce_row = job_row(engine, debounced[0].job.id)
    throttle_row = job_row(engine, throttled[0].job.id)
    assert debounce_row.scheduled_at == times[-1]  # every event pushes it back
    assert throttle_row.scheduled_at == times[0]  # the first event fixes the window
    assert debounce_row.args == throttle_row.args == [0, 1, 2]
    assert count_jobs(engine) == 2


# ------------------------------------------------------------------ the seed's examples


def test_send_email_added_twice_in_one_transaction_runs_once_with_count_2(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, SendEmail(count=1), job_key="abc")
        second = sa_jobs.insert(session, SendEmail(count=2), job_key="abc")
        assert first.action is InsertAction.INSERTED
        assert second.action is InsertAction.REPLACED
        assert second.job.id == first.job.id
        job_id = first.job.id
    seen: list[tuple[int, SendEmail]] = []
    worker = make_worker(engine)

    @worker.handler(SendEmail)
    def send(job: Job) -> None:
        seen.append((job.id, job.args))

    worker.run_until_idle(timeout=30)
    assert seen == [(job_id, SendEmail(count=2))]


def test_send_email_enqueued_twice_in_one_transaction_runs_once_with_count_2(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(sa_jobs.enqueue(SendEmail(count=1), job_key="abc"))
        session.add(sa_jobs.enqueue(SendEmail(count=2), job_key="abc"))
    (only,) = all_rows(engine)
    assert only.args == {"count": 2}
    seen: list[SendEmail] = []
    worker = make_worker(engine)

    @worker.handler(SendEmail)
    def send(job: Job) -> None:
        seen.append(job.args)

    worker.run_until_idle(timeout=30)
    assert seen == [SendEmail(count=2)]


def test_process_invoices_payloads_are_merged(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.insert(session, ProcessInvoices([{"id": 42}]), job_key="inv")
        sa_jobs.insert(session, ProcessInvoices([{"id": 67}]), job_key="inv")
    (only,) = all_rows(engine)
    assert only.args == [{"id": 42}, {"id": 67}]  # a JSON array, as Graphile stores it
    seen: list[ProcessInvoices] = []
    worker = make_worker(engine)

    @worker.handler(ProcessInvoices)
    def process(job: Job) -> None:
        seen.append(job.args)

    worker.run_until_idle(timeout=30)
    assert seen == [ProcessInvoices([{"id": 42}, {"id": 67}])]


def test_a_list_payload_class_stores_a_json_array(engine: Engine) -> None:
    result = insert_one(engine, ProcessEvents([1, 2]))
    assert job_row(engine, result.job.id).args == [1, 2]
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT jsonb_typeof(args) FROM sa_job")) == "array"


def test_the_preserve_run_at_batching_window(engine: Engine) -> None:
    window = db_now(engine) + dt.timedelta(seconds=10)
    first = insert_one(
        engine,
        ProcessEvents([1]),
        job_key="my_batch",
        job_key_mode="preserve_run_at",
        scheduled_at=window,
    )
    second = insert_one(
        engine,
        ProcessEvents([2]),
        job_key="my_batch",
        job_key_mode="preserve_run_at",
        scheduled_at=window + dt.timedelta(seconds=5),
    )
    assert second.action is InsertAction.REPLACED
    assert second.job.id == first.job.id
    batch = job_row(engine, first.job.id)
    assert batch.args == [1, 2]
    assert batch.scheduled_at == window  # runs at the originally scheduled time
    assert second.job.args == ProcessEvents([1, 2])


@pytest.mark.parametrize("order", ["array_then_object", "object_then_array"])
def test_a_non_array_payload_replaces_and_the_old_payload_is_lost(
    engine: Engine, order: str
) -> None:
    payloads: list[object] = [ProcessEvents([1]), Other(5)]
    if order == "object_then_array":
        payloads.reverse()
    first = insert_one(engine, payloads[0], job_key=KEY)
    second = insert_one(engine, payloads[1], job_key=KEY)
    assert second.action is InsertAction.REPLACED
    stored = job_row(engine, first.job.id)
    assert stored.args == ({"n": 5} if order == "array_then_object" else [1])
    assert stored.kind == ("jk_other" if order == "array_then_object" else "jk_process_events")


def test_an_empty_array_merges_like_any_array(engine: Engine) -> None:
    first = insert_one(engine, ProcessEvents([]), job_key=KEY)
    insert_one(engine, ProcessEvents([3]), job_key=KEY)
    insert_one(engine, ProcessEvents([]), job_key=KEY)
    assert job_row(engine, first.job.id).args == [3]


# ------------------------------------------------------------------ caveats


def test_a_completed_job_releases_its_key(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    job = fetch_one(engine)
    assert finish_run(engine, job, Ending.COMPLETED) == [(first.job.id, JobState.COMPLETED)]
    done = job_row(engine, first.job.id)
    assert (done.state, done.job_key) == (JobState.COMPLETED.value, None)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.NOT_FOUND
    assert job_row(engine, first.job.id).state == JobState.COMPLETED.value  # still there
    again = insert_one(engine, SendEmail(2), job_key=KEY)
    assert again.action is InsertAction.INSERTED
    assert again.job.id != first.job.id
    assert job_row(engine, again.job.id).args == {"count": 2}
    assert job_row(engine, first.job.id).args == {"count": 1}


def test_a_job_completed_by_a_worker_releases_its_key(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    worker = make_worker(engine)

    @worker.handler(SendEmail)
    def send(job: Job) -> None:
        pass

    worker.run_until_idle(timeout=30)
    assert job_row(engine, first.job.id).job_key is None
    again = insert_one(engine, SendEmail(2), job_key=KEY)
    assert again.action is InsertAction.INSERTED


def test_complete_in_releases_the_key(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    job = fetch_one(engine)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.complete_in(session, job)
    assert job_row(engine, first.job.id).job_key is None
    assert insert_one(engine, SendEmail(2), job_key=KEY).action is InsertAction.INSERTED


def test_a_cancelled_job_releases_its_key(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.cancel_job(session, first.job.id)
    cancelled = job_row(engine, first.job.id)
    assert (cancelled.state, cancelled.job_key) == (JobState.CANCELLED.value, None)
    again = insert_one(engine, SendEmail(2), job_key=KEY)
    assert again.action is InsertAction.INSERTED
    assert again.job.id != first.job.id


def test_a_running_job_cancelled_keeps_its_key_until_its_run_ends(engine: Engine) -> None:
    running = running_job(engine, SendEmail(1))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.cancel_job(session, running.id)
    assert job_row(engine, running.id).job_key == KEY
    fail_error = {"attempt": 1, "error": "JobCancelledError"}
    finish_run(engine, running, Ending.FAILED, delay=0, error=fail_error)
    ended = job_row(engine, running.id)
    assert (ended.state, ended.job_key) == (JobState.CANCELLED.value, None)


def test_a_discarded_job_keeps_its_key_until_a_new_add(engine: Engine) -> None:
    job_id = discarded_job(engine, SendEmail(1))
    assert holder_of(engine, KEY).id == job_id  # remove_job can still find it
    again = insert_one(engine, SendEmail(2), job_key=KEY)
    assert again.action is InsertAction.INSERTED
    assert holder_of(engine, KEY).id == again.job.id


def test_the_key_is_universal_across_kinds(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    other = insert_one(engine, Other(2), job_key=KEY)
    assert other.action is InsertAction.REPLACED
    assert other.job.id == first.job.id
    stored = job_row(engine, first.job.id)
    assert (stored.kind, stored.args) == ("jk_other", {"n": 2})
    assert other.job.args == Other(2)
    assert count_jobs(engine) == 1


def test_keys_are_exact_strings(engine: Engine) -> None:
    ids = {
        insert_one(engine, SendEmail(i), job_key=key).job.id
        for i, key in enumerate(["k", "K", "k ", " k", "ķ"])
    }
    assert len(ids) == 5


# The running-job caveat with a real worker: the old job finishes its run (however it
# ends) but never runs again; the new job runs once with the new values.
RUN_ENDINGS = ["complete", "fail", "snooze", "timeout", "shutdown"]


@pytest.mark.parametrize("ending", RUN_ENDINGS)
def test_a_running_job_that_is_replaced_finishes_but_never_runs_again(
    engine: Engine, ending: str
) -> None:
    clear_workers_and_leader(engine)
    first = insert_one(engine, ProcessEvents([1]), job_key=KEY, max_attempts=5)
    started = threading.Event()
    release = threading.Event()
    runs: list[tuple[int, int, list[int]]] = []
    lock = threading.Lock()
    options: dict[str, Any] = {"retry_policy": NO_DELAY}
    if ending == "timeout":
        options["job_timeout"] = 1.0
    worker = make_worker(engine, **options)

    @worker.handler(ProcessEvents)
    def handle(job: Job) -> None:
        with lock:
            runs.append((job.id, job.attempt, list(job.args.events)))
        if job.id != first.job.id:
            return
        started.set()
        if ending in ("timeout", "shutdown"):
            # Interrupted by the watchdog or by the shutdown.
            while not job.cancelled:
                time.sleep(0.01)  # a handler that looks at job.cancelled between steps
            job.check_cancelled()
            return
        assert release.wait(10)
        if ending == "fail":
            raise Boom("the old run fails")
        if ending == "snooze":
            raise JobSnooze(0)

    worker.start()
    try:
        wait_event(started, "the first run")
        replacement = insert_one(engine, ProcessEvents([2]), job_key=KEY, max_attempts=5)
        assert replacement.action is InsertAction.INSERTED
        assert replacement.job.id != first.job.id
        wait_for_state(engine, replacement.job.id, JobState.COMPLETED, timeout=10)
        release.set()
        if ending == "shutdown":
            worker.stop(cancel=True)
        old = wait_for_state(
            engine,
            first.job.id,
            JobState.COMPLETED if ending == "complete" else JobState.DISCARDED,
            timeout=10,
        )
        if worker.is_running:  # (after the shutdown ending, nothing runs any more)
            # Give a wrongly retried old job the chance to run again: the leader's
            # scheduler makes due jobs available, then the producer fetches.
            wait_passes(worker, "maintenance", 3)
            wait_passes(worker, "producer:default", 3)
    finally:
        release.set()
        worker.stop(cancel=True)
    old = job_row(engine, first.job.id)
    assert old.state == ("completed" if ending == "complete" else "discarded"), old
    assert old.job_key is None
    assert JOB_KEY_REPLACED_KEY in old.metadata
    assert old.attempt == 1
    new = job_row(engine, replacement.job.id)
    assert (new.state, new.job_key, new.args) == (JobState.COMPLETED.value, None, [2])
    # The old job ran exactly once, the new job exactly once, with its own payload.
    assert sorted(runs) == sorted([(first.job.id, 1, [1]), (replacement.job.id, 1, [2])])
    assert {r.state for r in all_rows(engine)} <= {"completed", "discarded"}


def test_a_replaced_running_job_that_is_rescued_is_discarded_not_retried(
    engine: Engine,
) -> None:
    clear_workers_and_leader(engine)
    insert_one(engine, SendEmail(1), job_key=KEY, max_attempts=5)
    running = fetch_one(engine, worker_id="ghost-worker")  # no heartbeat: presumed dead
    replacement = insert_one(engine, SendEmail(2), job_key=KEY)
    with engine.begin() as connection:
        rescued = Rescuer(0.0).rescue(connection)
    assert [tuple(r) for r in rescued] == [(running.id, JobState.DISCARDED)]
    assert job_row(engine, running.id).job_key is None
    assert holder_of(engine, KEY).id == replacement.job.id


def test_a_rescued_job_that_was_not_replaced_keeps_its_key_and_is_retried(
    engine: Engine,
) -> None:
    clear_workers_and_leader(engine)
    insert_one(engine, SendEmail(1), job_key=KEY, max_attempts=5)
    running = fetch_one(engine, worker_id="ghost-worker")
    with engine.begin() as connection:
        rescued = Rescuer(0.0).rescue(connection)
    assert [tuple(r) for r in rescued] == [(running.id, JobState.RETRYABLE)]
    assert job_row(engine, running.id).job_key == KEY
    # It failed before (the rescue's error): a new add resets it.
    insert_one(engine, SendEmail(2), job_key=KEY)
    after = job_row(engine, running.id)
    assert (after.errors, after.args) == ([], {"count": 2})
    assert after.max_attempts - after.attempt == DEFAULT_MAX_ATTEMPTS


# ------------------------------------------------------------------ remove_job


def test_remove_job_deletes_an_unlocked_job(engine: Engine) -> None:
    first = insert_one(engine, SendEmail(1), job_key=KEY)
    insert_one(engine, SendEmail(2), job_key="another")
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.REMOVED
    assert [r.id for r in all_rows(engine)] == [first.job.id + 1]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.NOT_FOUND


@pytest.mark.parametrize("state", ["scheduled", "retryable", "discarded"])
def test_remove_job_deletes_an_unlocked_job_in_any_state(engine: Engine, state: str) -> None:
    if state == "scheduled":
        later = db_now(engine) + FAR
        job_id = insert_one(engine, SendEmail(1), job_key=KEY, scheduled_at=later).job.id
    elif state == "retryable":
        job_id = retryable_job(engine, SendEmail(1))
    else:
        job_id = discarded_job(engine, SendEmail(1))
    assert job_row(engine, job_id).state == state
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) == "removed"
    assert count_jobs(engine) == 0


def test_remove_job_rolls_back_with_the_transaction(engine: Engine) -> None:
    insert_one(engine, SendEmail(1), job_key=KEY)
    with Session(engine) as session:
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.REMOVED
        session.rollback()
    assert count_jobs(engine) == 1


def test_remove_job_on_a_running_job_lets_it_finish_but_never_run_again(
    engine: Engine,
) -> None:
    running = running_job(engine, SendEmail(1), max_attempts=5)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.WILL_NOT_RUN_AGAIN
    after = job_row(engine, running.id)
    assert after.state == JobState.RUNNING.value
    assert after.job_key is None
    assert after.max_attempts == after.attempt == 1
    assert JOB_KEY_REPLACED_KEY in after.metadata
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, KEY) is RemoveOutcome.NOT_FOUND
    assert fail_run(engine, running, delay=0)
    assert job_row(engine, running.id).state == JobState.DISCARDED.value
    # The key is free for a new job.
    assert insert_one(engine, SendEmail(2), job_key=KEY).action is InsertAction.INSERTED


@pytest.mark.parametrize("ending", [Ending.SNOOZED, Ending.RETURNED])
def test_a_removed_running_job_that_snoozes_or_is_returned_is_discarded(
    engine: Engine, ending: Ending
) -> None:
    running = running_job(engine, SendEmail(1), max_attempts=5)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.remove_job(session, KEY)
    delay = 0.0 if ending is Ending.SNOOZED else None
    assert finish_run(engine, running, ending, delay=delay) == [(running.id, JobState.DISCARDED)]


def test_remove_job_on_a_running_job_with_a_real_worker(engine: Engine) -> None:
    clear_workers_and_leader(engine)
    first = insert_one(engine, SendEmail(1), job_key=KEY, max_attempts=5)
    started = threading.Event()
    release = threading.Event()
    runs: list[int] = []
    finished: list[int] = []
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(SendEmail)
    def handle(job: Job) -> None:
        runs.append(job.id)
        started.set()
        assert release.wait(10)
        finished.append(job.id)
        raise Boom("fails after the remove")

    worker.start()
    try:
        wait_event(started, "the run")
        with Session(engine, expire_on_commit=False) as session, session.begin():
            outcome = sa_jobs.remove_job(session, KEY)
        assert outcome is RemoveOutcome.WILL_NOT_RUN_AGAIN
        release.set()
        wait_for_state(engine, first.job.id, JobState.DISCARDED, timeout=10)
    finally:
        release.set()
        worker.stop(cancel=True)
    assert runs == finished == [first.job.id]  # the handler ran to its end, once
    assert len(job_row(engine, first.job.id).errors) == 1


def test_remove_job_of_a_missing_key(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, "nobody") is RemoveOutcome.NOT_FOUND


@pytest.mark.parametrize("key", ["", "x" * 513, 7, None, "nul\x00"])
def test_remove_job_validates_the_key(engine: Engine, key: Any) -> None:
    with Session(engine) as session, pytest.raises(InvalidOptionsError) as caught:
        sa_jobs.remove_job(session, key)
    assert caught.value.option == "job_key"


def test_remove_job_accepts_the_longest_key(engine: Engine) -> None:
    key = "k" * 512
    insert_one(engine, SendEmail(1), job_key=key)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.remove_job(session, key) is RemoveOutcome.REMOVED


def test_remove_outcomes_are_strings(engine: Engine) -> None:
    assert {o.value for o in RemoveOutcome} == {"removed", "will_not_run_again", "not_found"}


# ------------------------------------------------------------------ every insert path


def test_insert_returns_the_replaced_job_with_its_new_values(engine: Engine) -> None:
    first = insert_one(engine, ProcessEvents([1]), job_key=KEY)
    second = insert_one(engine, ProcessEvents([2]), job_key=KEY, priority=3)
    assert second.action is InsertAction.REPLACED
    assert second.unique_skipped_as_duplicate is False
    assert second.job.id == first.job.id
    assert second.job.args_json == [1, 2]
    assert second.job.args == ProcessEvents([1, 2])
    assert second.job.priority == 3


def test_insert_in_one_session_refreshes_the_loaded_job(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, ProcessEvents([1]), job_key=KEY)
        second = sa_jobs.insert(session, ProcessEvents([2]), job_key=KEY)
        assert second.job is first.job  # one identity
        assert first.job.args_json == [1, 2]
        assert first.job.args == ProcessEvents([1, 2])


@pytest.mark.parametrize("mode", list(JobKeyMode))
def test_enqueue_sets_insert_action(engine: Engine, mode: JobKeyMode) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        new = sa_jobs.enqueue(ProcessEvents([1]), job_key=KEY, job_key_mode=mode)
        session.add(new)
        session.flush()
        assert new.insert_action is InsertAction.INSERTED
        assert new.id is not None
    with Session(engine, expire_on_commit=False) as session, session.begin():
        again = sa_jobs.enqueue(ProcessEvents([2]), job_key=KEY, job_key_mode=mode)
        session.add(again)
        session.flush()
        assert again.id == new.id
        expected = [1] if mode is JobKeyMode.UNSAFE_DEDUPE else [1, 2]
        action = (
            InsertAction.DEDUPLICATED if mode is JobKeyMode.UNSAFE_DEDUPE else InsertAction.REPLACED
        )
        assert again.insert_action is action
        assert again.unique_skipped_as_duplicate is False
        assert again.args_json == expected
        assert again.args == ProcessEvents(expected)
    assert job_row(engine, new.id).args == expected


def test_enqueue_rollback_leaves_the_holder_as_it_was(engine: Engine) -> None:
    first = insert_one(engine, ProcessEvents([1]), job_key=KEY)
    with Session(engine) as session:
        session.add(sa_jobs.enqueue(ProcessEvents([2]), job_key=KEY))
        session.flush()
        session.rollback()
    assert job_row(engine, first.job.id).args == [1]


def test_enqueue_of_a_running_holder_creates_a_new_job(engine: Engine) -> None:
    running = running_job(engine, ProcessEvents([1]))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.enqueue(ProcessEvents([2]), job_key=KEY)
        session.add(job)
        session.flush()
        assert job.insert_action is InsertAction.INSERTED
        assert job.id != running.id
    assert job_row(engine, running.id).job_key is None


def test_insert_many_folds_repeats_of_a_key_in_order(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                ProcessEvents([1]),
                InsertManyParams(ProcessEvents([2]), InsertOpts(job_key="b")),
                ProcessEvents([3]),
                ProcessEvents([4]),
                InsertManyParams(ProcessEvents([5]), InsertOpts(job_key="b")),
            ],
            job_key="a",
        )
    actions = [r.action for r in results]
    assert actions == [
        InsertAction.INSERTED,
        InsertAction.INSERTED,
        InsertAction.REPLACED,
        InsertAction.REPLACED,
        InsertAction.REPLACED,
    ]
    a_id, b_id = results[0].job.id, results[1].job.id
    assert [r.job.id for r in results] == [a_id, b_id, a_id, a_id, b_id]
    assert job_row(engine, a_id).args == [1, 3, 4]
    assert job_row(engine, b_id).args == [2, 5]
    assert count_jobs(engine) == 2


def test_insert_many_last_values_win(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        now = session.scalar(select(func.now()))
        later = now + FAR
        results = sa_jobs.insert_many(
            session,
            [
                InsertManyParams(SendEmail(1), InsertOpts(job_key=KEY, priority=1)),
                InsertManyParams(SendEmail(2), InsertOpts(job_key=KEY, priority=2)),
                InsertManyParams(Other(3), InsertOpts(job_key=KEY, priority=3, scheduled_at=later)),
            ],
        )
    assert len({r.job.id for r in results}) == 1
    stored = job_row(engine, results[0].job.id)
    assert (stored.kind, stored.args, stored.priority) == ("jk_other", {"n": 3}, 3)
    assert (stored.scheduled_at, stored.state) == (later, JobState.SCHEDULED.value)


def test_insert_many_applies_repeats_with_mixed_modes_in_order(engine: Engine) -> None:
    later = db_now(engine) + FAR
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                InsertManyParams(ProcessEvents([1]), InsertOpts(job_key=KEY, scheduled_at=later)),
                InsertManyParams(
                    ProcessEvents([2]), InsertOpts(job_key=KEY, job_key_mode="preserve_run_at")
                ),
                InsertManyParams(
                    ProcessEvents([3]), InsertOpts(job_key=KEY, job_key_mode="unsafe_dedupe")
                ),
                InsertManyParams(ProcessEvents([9])),  # no key: a job of its own
                InsertManyParams(ProcessEvents([4]), InsertOpts(job_key=KEY)),
            ],
        )
    assert [r.action for r in results] == [
        InsertAction.INSERTED,
        InsertAction.REPLACED,
        InsertAction.DEDUPLICATED,
        InsertAction.INSERTED,
        InsertAction.REPLACED,
    ]
    keyed = job_row(engine, results[0].job.id)
    assert keyed.args == [1, 2, 4]
    assert keyed.state == JobState.AVAILABLE.value  # the last add (replace) made it due now
    assert job_row(engine, results[3].job.id).args == [9]
    assert job_row(engine, results[3].job.id).job_key is None


def test_insert_many_detaches_a_running_holder_then_merges_into_the_new_job(
    engine: Engine,
) -> None:
    running = running_job(engine, ProcessEvents([0]))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session, [ProcessEvents([1]), ProcessEvents([2])], job_key=KEY
        )
    assert [r.action for r in results] == [InsertAction.INSERTED, InsertAction.REPLACED]
    new_id = results[0].job.id
    assert new_id != running.id and results[1].job.id == new_id
    assert job_row(engine, new_id).args == [1, 2]
    assert job_row(engine, running.id).job_key is None


def test_insert_many_of_many_repeats_is_one_job_per_key(engine: Engine) -> None:
    keys = [f"k{i % 7}" for i in range(200)]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                InsertManyParams(ProcessEvents([i]), InsertOpts(job_key=key))
                for i, key in enumerate(keys)
            ],
        )
    assert sum(r.action is InsertAction.INSERTED for r in results) == 7
    rows = all_rows(engine)
    assert len(rows) == 7
    for stored in rows:
        expected = [i for i, key in enumerate(keys) if key == stored.job_key]
        assert stored.args == expected


def test_enqueue_flush_applies_repeats_in_order(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        jobs = [sa_jobs.enqueue(ProcessEvents([i]), job_key=f"k{i % 2}") for i in range(5)]
        session.add_all(jobs)
        session.flush()
        assert [j.insert_action for j in jobs] == [
            InsertAction.INSERTED,
            InsertAction.INSERTED,
            InsertAction.REPLACED,
            InsertAction.REPLACED,
            InsertAction.REPLACED,
        ]
        assert len({j.id for j in jobs}) == 2
    assert sorted(r.args for r in all_rows(engine)) == [[0, 2, 4], [1, 3]]


def test_insert_job_refuses_job_keys() -> None:
    with pytest.raises(InvalidOptionsError) as caught:
        sa_jobs.insert_job(SendEmail(1), job_key=KEY)
    assert caught.value.option == "job_key"
    assert "sa_jobs.insert()" in str(caught.value)


def test_unkeyed_results_say_inserted_or_skipped(engine: Engine) -> None:
    first = insert_one(engine, UniqueKind(1))
    second = insert_one(engine, UniqueKind(1))
    assert first.action is InsertAction.INSERTED
    assert (second.action, second.unique_skipped_as_duplicate) == (
        InsertAction.SKIPPED_DUPLICATE,
        True,
    )
    assert {a.value for a in InsertAction} == {
        "inserted",
        "skipped_duplicate",
        "replaced",
        "deduplicated",
    }


def test_an_async_session_can_add_with_a_key(engine: Engine, database_url: URL) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def go() -> list[InsertAction]:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                first = await session.run_sync(sa_jobs.insert, ProcessEvents([1]), job_key=KEY)
                job = sa_jobs.enqueue(ProcessEvents([2]), job_key=KEY)
                session.add(job)
                await session.flush()
                return [first.action, job.insert_action]
        finally:
            await async_engine.dispose()

    assert asyncio.run(go()) == [InsertAction.INSERTED, InsertAction.REPLACED]
    assert [r.args for r in all_rows(engine)] == [[1, 2]]


# ------------------------------------------------------------------ option validation

BAD_KEYS = ["", "x" * 513, 12, b"bytes", "nul\x00"]

PATHS: dict[str, Callable[[Session, dict[str, Any]], object]] = {
    "insert": lambda session, opts: sa_jobs.insert(session, SendEmail(1), **opts),
    "insert_many": lambda session, opts: sa_jobs.insert_many(
        session, [SendEmail(1), SendEmail(2)], **opts
    ),
    "insert_many_params": lambda session, opts: sa_jobs.insert_many(
        session, [SendEmail(0), InsertManyParams(SendEmail(1), InsertOpts(**opts))]
    ),
    "enqueue": lambda session, opts: session.add(sa_jobs.enqueue(SendEmail(1), **opts)),
    "insert_job": lambda session, opts: sa_jobs.insert_job(SendEmail(1), **opts),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("key", BAD_KEYS, ids=["empty", "513", "int", "bytes", "nul"])
def test_a_bad_job_key_is_refused_on_every_path(engine: Engine, path: str, key: Any) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        with pytest.raises(InvalidOptionsError) as caught:
            PATHS[path](session, {"job_key": key})
        assert caught.value.option == "job_key"
    assert count_jobs(engine) == 0  # nothing was written, not even the valid rows


@pytest.mark.parametrize("length", [1, 512])
def test_keys_of_1_to_512_characters_are_accepted(engine: Engine, length: int) -> None:
    key = "é" * length  # characters, not bytes
    result = insert_one(engine, SendEmail(1), job_key=key)
    assert job_row(engine, result.job.id).job_key == key


@pytest.mark.parametrize("path", list(PATHS))
def test_job_key_mode_without_a_job_key_inserts_a_plain_job(engine: Engine, path: str) -> None:
    # As Graphile's add_job does: the mode only matters when there is a key.
    with Session(engine) as session, session.begin():
        for _ in range(2):
            made = PATHS[path](session, {"job_key_mode": JobKeyMode.PRESERVE_RUN_AT})
            if path == "insert_job":
                session.execute(made)  # type: ignore[call-overload]
    with engine.connect() as connection:
        keys = connection.execute(text("SELECT job_key FROM sa_job")).scalars().all()
    assert len(keys) >= 2 and set(keys) == {None}


def test_an_unknown_job_key_mode_is_an_error() -> None:
    with pytest.raises(InvalidOptionsError) as caught:
        InsertOpts(job_key=KEY, job_key_mode="dedupe")
    assert caught.value.option == "job_key_mode"
    assert "unsafe_dedupe" in str(caught.value)


def test_job_key_modes_may_be_given_as_strings() -> None:
    assert InsertOpts(job_key=KEY, job_key_mode="preserve_run_at").job_key_mode is (
        JobKeyMode.PRESERVE_RUN_AT
    )
    assert InsertOpts(job_key=KEY).job_key_mode is None  # resolved to replace later


@pytest.mark.parametrize("path", list(PATHS))
def test_a_job_key_with_unique_options_is_an_error(engine: Engine, path: str) -> None:
    with Session(engine) as session, pytest.raises(InvalidOptionsError) as caught:
        PATHS[path](session, {"job_key": KEY, "unique": UniqueOpts(by_args=True)})
    assert caught.value.option == "job_key"
    assert "unique" in str(caught.value)


def test_a_job_key_on_a_kind_with_unique_defaults_is_an_error(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidOptionsError, match="unique"):
            sa_jobs.insert(session, UniqueKind(1), job_key=KEY)
        with pytest.raises(InvalidOptionsError, match="unique"):
            sa_jobs.enqueue(UniqueKind(1), job_key=KEY)
        with pytest.raises(InvalidOptionsError, match="unique"):
            sa_jobs.insert_many(session, [UniqueKind(1)], job_key=KEY)


def test_empty_unique_options_turn_the_kinds_uniqueness_off_for_a_keyed_add(
    engine: Engine,
) -> None:
    first = insert_one(engine, UniqueKind(1), job_key=KEY, unique=UniqueOpts())
    second = insert_one(engine, UniqueKind(1), job_key=KEY, unique=UniqueOpts())
    assert (first.action, second.action) == (InsertAction.INSERTED, InsertAction.REPLACED)
    assert job_row(engine, first.job.id).unique_key is None


@pytest.mark.parametrize("path", list(PATHS))
def test_a_job_key_with_a_sequence_is_an_error(engine: Engine, path: str) -> None:
    with Session(engine) as session, pytest.raises(InvalidOptionsError) as caught:
        PATHS[path](session, {"job_key": KEY, "sequence": SequenceOpts()})
    assert caught.value.option == "job_key"
    assert "sequence" in str(caught.value)


def test_a_job_key_on_a_sequenced_kind_is_an_error(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(InvalidOptionsError, match="sequence"):
        sa_jobs.insert(session, SequencedKind(1), job_key=KEY)


# ------------------------------------------------------------------ results after a reset


def test_a_replaced_failed_job_runs_again_with_the_new_payload(engine: Engine) -> None:
    # End to end: a job that failed and waits for its retry is reset by a new add and
    # runs again with the merged payload, its attempts counted from zero.
    clear_workers_and_leader(engine)
    first = insert_one(engine, ProcessEvents([1]), job_key=KEY, max_attempts=3)
    seen: list[tuple[int, int, list[int]]] = []
    worker = make_worker(engine, retry_policy=AN_HOUR)

    @worker.handler(ProcessEvents)
    def handle(job: Job) -> None:
        seen.append((job.id, job.attempt, list(job.args.events)))
        if job.args.events == [1]:
            raise Boom("first payload fails")

    worker.run_until_idle(timeout=30)
    assert job_row(engine, first.job.id).state == JobState.RETRYABLE.value
    again = insert_one(engine, ProcessEvents([2]), job_key=KEY, max_attempts=3)
    assert (again.action, again.job.id, again.revision) == (InsertAction.REPLACED, first.job.id, 1)
    worker.run_until_idle(timeout=30)
    assert seen == [(first.job.id, 1, [1]), (first.job.id, 1, [1, 2])]
    done = job_row(engine, first.job.id)
    assert (done.state, done.job_key, done.run_count) == (JobState.COMPLETED.value, None, 2)


def test_the_revision_counts_updates_in_place(engine: Engine) -> None:
    results = [insert_one(engine, SendEmail(n), job_key=KEY) for n in range(4)]
    assert [r.revision for r in results] == [0, 1, 2, 3]
    assert len({r.job.id for r in results}) == 1
    assert job_row(engine, results[0].job.id).revision == 3
    other = insert_one(engine, SendEmail(9), job_key="another key")
    assert other.revision == 0
    plain = insert_one(engine, SendEmail(9))
    assert plain.revision is None
    with Session(engine) as session, session.begin():
        job = sa_jobs.enqueue(SendEmail(5), job_key=KEY)
        session.add(job)
        session.flush()
        assert job.revision == 4


# ------------------------------------------------------------------ the migration branch


def test_the_job_key_branch_depends_on_core(pg_server: Server) -> None:
    # Installing the job_key branch alone brings the core with it; the code needs the
    # core at its head as well.
    with (
        throwaway_database(pg_server, prefix="sa_jobs_jk_branch_only") as url,
        engine_at(url) as engine,
    ):
        sa_jobs.migrate(engine, f"{JOB_KEY_BRANCH}@head")
        with engine.connect() as connection:
            assert installed_branches(connection) == {CORE_BRANCH, JOB_KEY_BRANCH}
        with Session(engine) as session, pytest.raises(SchemaMissingError) as caught:
            sa_jobs.insert(session, SendEmail(1), job_key=KEY)
        assert caught.value.outdated and caught.value.branch == CORE_BRANCH
        assert "is not up to date" in str(caught.value)
        sa_jobs.migrate(engine, f"{CORE_BRANCH}@head")
        with Session(engine) as session, session.begin():
            assert sa_jobs.insert(session, SendEmail(1), job_key=KEY).action == "inserted"
            assert sa_jobs.insert(session, SendEmail(2), job_key=KEY).action == "replaced"


def test_sa_jobs_core_head_installs_no_job_key_branch(core_only: Engine) -> None:
    with core_only.connect() as connection:
        assert installed_branches(connection) == {CORE_BRANCH}


KEYED_PATHS: dict[str, Callable[[Session], object]] = {
    "insert": lambda session: sa_jobs.insert(session, SendEmail(1), job_key=KEY),
    "insert_many": lambda session: sa_jobs.insert_many(
        session, [SendEmail(1), SendEmail(2)], job_key=KEY
    ),
    "enqueue": lambda session: (
        session.add(sa_jobs.enqueue(SendEmail(1), job_key=KEY)),
        session.flush(),
    ),
    "unsafe_dedupe": lambda session: sa_jobs.insert(
        session, SendEmail(1), job_key=KEY, job_key_mode="unsafe_dedupe"
    ),
}


# Keyed adds in replace/preserve_run_at start with the detach CTE, whose missing column
# PostgreSQL names qualified and unquoted ('column sa_job.job_key does not exist').
_CORE_ONLY_KEYED = [
    pytest.param(
        path,
    )
    if path != "unsafe_dedupe"
    else path
    for path in KEYED_PATHS
]


@pytest.mark.parametrize("path", _CORE_ONLY_KEYED)
def test_a_keyed_add_without_the_job_key_branch_names_the_branch(
    core_only: Engine, path: str
) -> None:
    with Session(core_only) as session, pytest.raises(SchemaMissingError) as caught:
        KEYED_PATHS[path](session)
    assert caught.value.branch == JOB_KEY_BRANCH
    assert "sa_jobs_job_key" in str(caught.value)


def test_remove_job_without_the_job_key_branch_names_the_branch(core_only: Engine) -> None:
    with Session(core_only) as session, pytest.raises(SchemaMissingError) as caught:
        sa_jobs.remove_job(session, KEY)
    assert caught.value.branch == JOB_KEY_BRANCH


def test_unkeyed_jobs_and_a_worker_work_without_the_job_key_branch(core_only: Engine) -> None:
    clear_workers_and_leader(core_only)
    with Session(core_only) as session, session.begin():
        ids = [r.job.id for r in sa_jobs.insert_many(session, [SendEmail(1), SendEmail(2)])]
        session.add(sa_jobs.enqueue(ProcessEvents([1])))
    with Session(core_only) as session, session.begin():
        sa_jobs.cancel_job(session, ids[1])
    done: list[int] = []
    worker = make_worker(core_only)

    @worker.handler(SendEmail)
    def send(job: Job) -> None:
        done.append(job.id)

    @worker.handler(ProcessEvents)
    def process(job: Job) -> None:
        done.append(job.id)

    worker.run_until_idle(timeout=30)
    assert sorted(done) == [ids[0], ids[1] + 1]


# ------------------------------------------------------------------ bugs


def test_insert_many_repeats_return_jobs_whose_args_match_the_row(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session, [ProcessEvents([1]), ProcessEvents([2]), ProcessEvents([3])], job_key=KEY
        )
        for result in results:
            assert result.job.args_json == [1, 2, 3]
            assert result.job.args == ProcessEvents([1, 2, 3])


def test_enqueue_twice_in_one_session_refreshes_the_first_object(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.enqueue(SendEmail(1), job_key=KEY)
        session.add(first)
        session.flush()
        second = sa_jobs.enqueue(SendEmail(2), job_key=KEY)
        session.add(second)
        session.flush()
        assert second.insert_action is InsertAction.REPLACED
        assert second.args_json == {"count": 2}
        loaded = session.get(Job, first.id)
        assert loaded is not None
        assert loaded.args_json == {"count": 2}
        assert loaded.args == SendEmail(2)


def test_a_replaced_snoozed_job_gets_every_attempt_the_add_asked_for(engine: Engine) -> None:
    insert_one(engine, SendEmail(1), job_key=KEY, max_attempts=2)
    job = fetch_one(engine)
    assert finish_run(engine, job, Ending.SNOOZED, delay=0.0)
    snoozed = job_row(engine, job.id)
    assert (snoozed.attempt, snoozed.max_attempts) == (0, 2)  # the attempt given back
    insert_one(engine, SendEmail(2), job_key=KEY, max_attempts=3)
    after = job_row(engine, job.id)
    assert (after.attempt, after.max_attempts) == (0, 3)


def test_a_late_result_of_a_rescued_run_does_not_complete_the_reset_job(
    engine: Engine,
) -> None:
    clear_workers_and_leader(engine)
    insert_one(engine, ProcessEvents([1]), job_key=KEY)
    old_run = fetch_one(engine, worker_id="partitioned-worker")
    with engine.begin() as connection:
        rescued = Rescuer(0.0).rescue(connection)
    assert [tuple(r) for r in rescued] == [(old_run.id, JobState.RETRYABLE)]
    insert_one(engine, ProcessEvents([2]), job_key=KEY)  # reset: attempt 0, args [1, 2]
    new_run = fetch_one(engine, worker_id="live-worker")
    assert new_run.id == old_run.id
    # The first run's worker wakes up and completes its (stale) run.
    with Session(engine) as session, session.begin(), pytest.raises(JobStateError):
        sa_jobs.complete_in(session, old_run)
    assert job_row(engine, old_run.id).state == JobState.RUNNING.value
