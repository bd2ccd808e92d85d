"""The maintenance services, one ``run_once`` at a time, on rows written by the factory."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine

from sa_jobs._base.states import JobState
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from sa_jobs.worker.maintenance.leader import LeaderElection
from sa_jobs.worker.maintenance.rescuer import Rescuer
from sa_jobs.worker.maintenance.scheduler import Scheduler
from tests.factories import job_row, leader_row, make_job, make_worker_row, seconds
from tests.helpers import (
    db_now,
    insert_listener,
    job_states,
    notified_queues,
    run_once,
    wait_past,
)

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")

hours = dt.timedelta(hours=1)
days = dt.timedelta(days=1)


@pytest.fixture
def listener(database_url: URL) -> Iterator[psycopg.Connection[Any]]:
    with insert_listener(database_url) as connection:
        yield connection


# ------------------------------------------------------------------ scheduler


def test_scheduler_promotes_due_scheduled_and_retryable_jobs_only(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    past, future = -seconds(1), seconds(3600)
    due_scheduled = make_job(engine, state=JobState.SCHEDULED, queue="a", scheduled_at=past)
    due_retryable = make_job(
        engine, state=JobState.RETRYABLE, queue="b", attempt=1, scheduled_at=past
    )
    later_scheduled = make_job(engine, state=JobState.SCHEDULED, queue="c", scheduled_at=future)
    later_retryable = make_job(
        engine, state=JobState.RETRYABLE, queue="c", attempt=1, scheduled_at=future
    )
    untouched = {
        make_job(engine, state=JobState.RUNNING, queue="d", scheduled_at=past): JobState.RUNNING,
        make_job(engine, state=JobState.COMPLETED, queue="d", scheduled_at=past): (
            JobState.COMPLETED
        ),
        make_job(engine, state=JobState.PENDING, queue="d", scheduled_at=past): JobState.PENDING,
    }
    notified_queues(listener)  # the factory's inserts may notify; only the scheduler's count

    assert run_once(engine, Scheduler()) == 2

    assert job_states(engine) == {
        due_scheduled: JobState.AVAILABLE,
        due_retryable: JobState.AVAILABLE,
        later_scheduled: JobState.SCHEDULED,
        later_retryable: JobState.RETRYABLE,
        **untouched,
    }
    assert sorted(notified_queues(listener)) == ["a", "b"]
    # Promotion keeps the attempt count and the due time.
    assert job_row(engine, due_retryable).attempt == 1


def test_scheduler_notifies_each_queue_once_per_pass(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    for _ in range(5):
        make_job(engine, state=JobState.SCHEDULED, queue="many", scheduled_at=-seconds(1))
    notified_queues(listener)
    assert run_once(engine, Scheduler()) == 5
    assert notified_queues(listener) == ["many"]


def test_scheduler_with_nothing_due_does_nothing(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    make_job(engine, state=JobState.SCHEDULED, scheduled_at=seconds(60))
    notified_queues(listener)
    assert run_once(engine, Scheduler()) == 0
    assert notified_queues(listener) == []


def test_scheduler_rolled_back_sends_nothing(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    job = make_job(engine, state=JobState.SCHEDULED, queue="r", scheduled_at=-seconds(1))
    notified_queues(listener)
    with engine.connect() as connection, connection.begin() as transaction:
        assert Scheduler().run_once(connection) == 1
        transaction.rollback()
    assert notified_queues(listener) == []
    assert job_states(engine) == {job: JobState.SCHEDULED}


# ------------------------------------------------------------------ rescuer


def rescue(engine: Engine, rescue_after: float = 5.0) -> int:
    return run_once(engine, Rescuer(rescue_after))


def running_row(engine: Engine, worker_id: str, **kwargs: Any) -> int:
    """A running job attempted a minute ago by ``worker_id`` (written by the factory)."""
    kwargs.setdefault("attempt", 1)
    kwargs.setdefault("attempted_at", -seconds(60))
    return make_job(
        engine,
        state=JobState.RUNNING,
        attempted_by=kwargs.pop("attempted_by", [worker_id]),
        **kwargs,
    )


def test_rescuer_rescues_job_of_a_worker_without_heartbeat_row(engine: Engine) -> None:
    job = running_row(engine, "gone")
    assert rescue(engine) == 1

    row = job_row(engine, job)
    assert row.state is JobState.RETRYABLE
    assert row.attempt == 1
    assert row.finalized_at is None
    (error,) = row.errors
    assert error["attempt"] == 1
    assert "RescuedError" in error["error"]
    assert "gone" in error["error"]
    # Due again later (after the backoff), and the scheduler brings it back.
    assert row.scheduled_at > db_now(engine)


def test_rescuer_rescues_job_of_a_worker_whose_heartbeat_is_stale(engine: Engine) -> None:
    make_worker_row(engine, "stale", heartbeat_at=-seconds(30))
    job = running_row(engine, "stale")
    assert rescue(engine, rescue_after=5) == 1
    assert job_row(engine, job).state is JobState.RETRYABLE


def test_rescuer_leaves_jobs_of_a_heartbeating_worker_however_long_they_run(
    engine: Engine,
) -> None:
    make_worker_row(engine, "alive", heartbeat_at=-seconds(1))
    job = running_row(engine, "alive", attempted_at=-days)
    assert rescue(engine, rescue_after=5) == 0
    row = job_row(engine, job)
    assert row.state is JobState.RUNNING
    assert row.errors == []


def test_rescuer_respects_rescue_after(engine: Engine) -> None:
    make_worker_row(engine, "quiet", heartbeat_at=-seconds(10))
    job = running_row(engine, "quiet")
    assert rescue(engine, rescue_after=60) == 0
    assert rescue(engine, rescue_after=5) == 1
    assert job_row(engine, job).state is JobState.RETRYABLE


def test_rescuer_gives_a_just_fetched_job_time_for_its_worker_to_heartbeat(
    engine: Engine,
) -> None:
    job = running_row(engine, "just_started", attempted_at=-seconds(0.5))
    assert rescue(engine, rescue_after=5) == 0
    assert job_row(engine, job).state is JobState.RUNNING


def test_rescuer_looks_at_the_last_worker_that_attempted_the_job(engine: Engine) -> None:
    make_worker_row(engine, "alive")
    by_alive_last = running_row(engine, "x", attempted_by=["gone", "alive"], attempt=2)
    by_gone_last = running_row(engine, "x", attempted_by=["alive", "gone"], attempt=2)
    assert rescue(engine) == 1
    assert job_states(engine) == {
        by_alive_last: JobState.RUNNING,
        by_gone_last: JobState.RETRYABLE,
    }


def test_rescuer_discards_a_job_with_no_attempts_left(engine: Engine) -> None:
    job = running_row(engine, "gone", attempt=3, max_attempts=3)
    assert rescue(engine) == 1
    row = job_row(engine, job)
    assert row.state is JobState.DISCARDED
    assert row.finalized_at is not None
    assert "RescuedError" in row.errors[-1]["error"]


def test_rescuer_cancels_a_job_someone_asked_to_cancel(engine: Engine) -> None:
    job = running_row(engine, "gone", metadata={"cancel_attempted_at": "2026-01-01T00:00:00+00:00"})
    assert rescue(engine) == 1
    row = job_row(engine, job)
    assert row.state is JobState.CANCELLED
    assert row.finalized_at is not None


def test_rescuer_appends_to_earlier_errors(engine: Engine) -> None:
    earlier = {"attempt": 1, "error": "ValueError: first try"}
    job = running_row(engine, "gone", attempt=2, errors=[earlier])
    assert rescue(engine) == 1
    errors = job_row(engine, job).errors
    assert errors[0] == earlier
    assert errors[1]["attempt"] == 2
    assert "RescuedError" in errors[1]["error"]


def test_rescuer_only_touches_running_jobs(engine: Engine) -> None:
    others = {
        make_job(engine, state=state, attempted_by=["gone"], attempted_at=-days, attempt=1): state
        for state in JobState
        if state is not JobState.RUNNING
    }
    assert rescue(engine) == 0
    assert job_states(engine) == others


def test_rescued_job_is_worked_again_after_the_scheduler_promotes_it(engine: Engine) -> None:
    job = running_row(engine, "gone")
    assert rescue(engine) == 1
    # Attempt 1's backoff is about a second (attempt ** 4).
    assert run_once(engine, Scheduler()) == 0
    wait_past(engine, job_row(engine, job).scheduled_at, timeout=1.3)
    assert run_once(engine, Scheduler()) == 1
    assert job_row(engine, job).state is JobState.AVAILABLE


# ------------------------------------------------------------------ cleaner


def clean(engine: Engine, retention: Retention | None = None) -> int:
    return run_once(engine, Cleaner(retention or Retention()))


def test_cleaner_deletes_finished_jobs_past_the_default_retention(engine: Engine) -> None:
    def finished(state: JobState, age: dt.timedelta) -> int:
        return make_job(engine, state=state, finalized_at=-age)

    gone = [
        finished(JobState.COMPLETED, 25 * hours),
        finished(JobState.CANCELLED, 25 * hours),
        finished(JobState.DISCARDED, 8 * days),
    ]
    kept = {
        finished(JobState.COMPLETED, 23 * hours): JobState.COMPLETED,
        finished(JobState.CANCELLED, 23 * hours): JobState.CANCELLED,
        # Discarded jobs are kept a week, to be looked at.
        finished(JobState.DISCARDED, 2 * days): JobState.DISCARDED,
        finished(JobState.DISCARDED, 6 * days): JobState.DISCARDED,
        # Unfinished jobs are never cleaned, however old.
        make_job(engine, state=JobState.AVAILABLE, scheduled_at=-30 * days): JobState.AVAILABLE,
        make_job(engine, state=JobState.RETRYABLE, scheduled_at=-30 * days): JobState.RETRYABLE,
        make_job(
            engine, state=JobState.RUNNING, attempted_by=["x"], attempted_at=-30 * days
        ): JobState.RUNNING,
    }
    assert clean(engine) == len(gone)
    assert job_states(engine) == kept


def test_cleaner_keeps_forever_when_retention_is_none(engine: Engine) -> None:
    ancient = -365 * days
    jobs = {
        make_job(engine, state=state, finalized_at=ancient): state
        for state in (JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED)
    }
    assert clean(engine, Retention(completed=None, cancelled=None, discarded=None)) == 0
    assert job_states(engine) == jobs


def test_cleaner_applies_each_states_own_retention(engine: Engine) -> None:
    completed = make_job(engine, state=JobState.COMPLETED, finalized_at=-seconds(120))
    cancelled = make_job(engine, state=JobState.CANCELLED, finalized_at=-seconds(120))
    discarded = make_job(engine, state=JobState.DISCARDED, finalized_at=-seconds(120))
    retention = Retention(
        completed=dt.timedelta(minutes=1), cancelled=None, discarded=dt.timedelta(minutes=5)
    )
    assert clean(engine, retention) == 1
    assert set(job_states(engine)) == {cancelled, discarded}
    assert completed not in job_states(engine)


def test_cleaner_deletes_in_bounded_batches(engine: Engine) -> None:
    for _ in range(25):
        make_job(engine, state=JobState.COMPLETED, finalized_at=-2 * days)
    assert run_once(engine, Cleaner(Retention(), limit=10)) == 10
    assert len(job_states(engine)) == 15


# ------------------------------------------------------------------ leader election


def elect(engine: Engine, election: LeaderElection) -> bool:
    return run_once(engine, election) == 1


def resign(engine: Engine, election: LeaderElection) -> None:
    with engine.begin() as connection:
        election.resign(connection)


def test_only_one_of_two_elections_leads(engine: Engine) -> None:
    a, b = LeaderElection("a", ttl=5), LeaderElection("b", ttl=5)
    assert elect(engine, a) is True
    assert elect(engine, b) is False
    assert elect(engine, a) is True
    assert elect(engine, b) is False
    assert leader_row(engine).leader_id == "a"


def test_leader_renewal_extends_the_lease_and_keeps_the_election_time(engine: Engine) -> None:
    a = LeaderElection("a", ttl=5)
    assert elect(engine, a)
    first = leader_row(engine)
    wait_past(engine, first.elected_at)  # a renewal now has a later now() to count from
    assert elect(engine, a)
    renewed = leader_row(engine)
    assert renewed.elected_at == first.elected_at
    assert renewed.expires_at > first.expires_at


def test_a_leader_that_keeps_renewing_keeps_leading_past_its_ttl(engine: Engine) -> None:
    a, b = LeaderElection("a", ttl=0.5), LeaderElection("b", ttl=0.5)
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        assert elect(engine, a)
        assert not elect(engine, b)
        time.sleep(0.05)  # renewals spread over real time, past the 0.5 s ttl


def test_many_concurrent_elections_make_exactly_one_leader(engine: Engine) -> None:
    contenders = 12
    barrier = threading.Barrier(contenders)
    won: list[str] = []
    failures: list[BaseException] = []

    def contend(index: int) -> None:
        election = LeaderElection(f"c{index}", ttl=5)
        try:
            barrier.wait()
            if elect(engine, election):
                won.append(election.worker_id)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(won) == 1
    assert leader_row(engine).leader_id == won[0]


def test_another_takes_over_when_the_leader_stops_renewing(engine: Engine) -> None:
    a, b = LeaderElection("a", ttl=0.5), LeaderElection("b", ttl=0.5)
    assert elect(engine, a)
    first = leader_row(engine)
    assert not elect(engine, b)
    wait_past(engine, first.expires_at)  # "a" died: no renewal past its ttl
    assert elect(engine, b)
    taken = leader_row(engine)
    assert taken.leader_id == "b"
    assert taken.elected_at > first.elected_at
    # The old leader learns it lost on its next try, and does not steal the lease back.
    assert not elect(engine, a)
    assert leader_row(engine).leader_id == "b"


def test_a_late_leader_stops_leading_by_its_own_clock_before_another_can_take_over(
    engine: Engine,
) -> None:
    a, b = LeaderElection("a", ttl=0.5), LeaderElection("b", ttl=0.5)
    assert elect(engine, a) and a.is_leader
    assert not elect(engine, b) and not b.is_leader
    # "a" is held up (no renewal): by the time the database lets "b" in, "a" has stopped
    # believing it leads, though it never heard that it lost.
    wait_past(engine, leader_row(engine).expires_at)
    assert not a.is_leader
    assert elect(engine, b) and b.is_leader
    assert not a.is_leader
    assert not elect(engine, a) and not a.is_leader


def test_a_renewal_whose_commit_fails_leaves_no_belief_of_leading(engine: Engine) -> None:
    a = LeaderElection("a", ttl=60)
    with pytest.raises(RuntimeError), engine.begin() as connection:
        assert a.run_once(connection) == 1
        raise RuntimeError("the commit never happened")
    a.lapse()  # what the maintenance loop does when the election step fails
    assert not a.is_leader
    assert leader_row(engine) is None


def test_resign_hands_over_at_once(engine: Engine) -> None:
    a, b = LeaderElection("a", ttl=60), LeaderElection("b", ttl=60)
    assert elect(engine, a)
    assert not elect(engine, b)
    resign(engine, a)
    assert not a.is_leader
    assert leader_row(engine) is None
    assert elect(engine, b)


def test_resign_by_a_non_leader_changes_nothing(engine: Engine) -> None:
    a, b = LeaderElection("a", ttl=60), LeaderElection("b", ttl=60)
    assert elect(engine, a)
    resign(engine, b)
    assert leader_row(engine).leader_id == "a"
    assert not elect(engine, b)
