"""A Hypothesis state machine for job keys, checked against a small in-memory model.

The machine adds jobs with keys (every mode, every insert path, batches repeating a
key, array and object payloads, due now / in the past / far in the future), starts them
as a worker's fetch does, completes them, fails them (retryable while attempts remain,
discarded when none do), snoozes them or returns them as a shutdown does, cancels them,
lets the scheduler promote due ones, and removes keys with ``remove_job`` — on a real
database. After every step the whole table is compared with the model: each job's kind,
args, state, ``scheduled_at``, attempt, max_attempts, errors, the key it holds and the
metadata flags, so *which job holds each key* is checked at every step. Every add's
result (inserted, replaced or deduplicated; which job) is the one the model predicts.

**The model** is Graphile's algorithm as sa_jobs documents it. A job holds its key until
it completes or is cancelled (or is removed, or loses it while running). Adding with a
key:

* nobody holds it → a new job;
* ``unsafe_dedupe`` → the holder, untouched;
* the holder is running → it loses the key, ``max_attempts = attempt``, and a new job is
  created; if it then fails, snoozes or is returned it is discarded;
* the holder is discarded (failed for good) → it loses the key, nothing else, and a new
  job is created;
* otherwise it is updated in place (``revision + 1``) with Graphile's reset — attempt 0,
  errors cleared, the add's ``max_attempts`` — and every new value, ``scheduled_at``
  too except under ``preserve_run_at`` for a job that has not failed (attempt 0).

A snooze or a shutdown gives the attempt back (River); ``max_attempts`` never changes on
its own. A job that ends (completed, cancelled, discarded) keeps its ``scheduled_at``.

Both array payloads → concatenated; otherwise replaced.

**Times.** Jobs are added due now (``None``), at fixed past times or at fixed times in
2100, so the model knows most ``scheduled_at`` values exactly; ``now()`` and
``now() + delay`` (failures and snoozes) are checked to within a minute, and delays are
0 or an hour, so due and not-due never get close.

One throwaway database serves every example; the table is truncated when a machine
starts. Bounded at 80 runs of up to 40 steps (about fifteen seconds).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertAction, InsertManyParams, InsertOpts, JobKeyMode, JobState
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY, JOB_KEY_REPLACED_KEY
from sa_jobs._insert.job_key import RemoveOutcome
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.producer import fetch_jobs
from tests.budget import examples
from tests.helpers import (
    empty_job_table,
    finish_outcomes,
    run_once,
)

# ------------------------------------------------------------------ the jobs


@sa_jobs.job_args(kind="jkm_batch", list_payload=True)
class Batch:
    items: list[int] = []


@sa_jobs.job_args(kind="jkm_single")
class Single:
    n: int = 0


KEYS = ("a", "b", "c")
PAST = tuple(dt.datetime(2020, 1, 1, 0, minute, tzinfo=dt.UTC) for minute in range(3))
FUTURE = tuple(dt.datetime(2100, 1, 1, 0, minute, tzinfo=dt.UTC) for minute in range(3))
HOUR = 3600.0
#: How far a "now"-based time may be from the model's idea of it.
TOLERANCE = dt.timedelta(seconds=60)
FINAL = {JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED}


@attrs.frozen
class When:
    """A ``scheduled_at``: exact, or ``now() + offset`` as the test saw the clock."""

    at: dt.datetime
    approx: bool = False

    @classmethod
    def now_plus(cls, seconds: float = 0.0) -> When:
        return cls(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds), approx=True)

    @property
    def future(self) -> bool:
        return self.at > dt.datetime.now(dt.UTC)

    def matches(self, value: dt.datetime) -> bool:
        if self.approx:
            return abs(value - self.at) <= TOLERANCE
        return value == self.at


@attrs.frozen
class Add:
    """One add as drawn."""

    key: str
    mode: JobKeyMode
    array: bool  # Batch (array payload) or Single (object payload)
    value: int
    when: dt.datetime | None
    max_attempts: int

    def args(self) -> object:
        return Batch([self.value]) if self.array else Single(self.value)

    @property
    def kind(self) -> str:
        return "jkm_batch" if self.array else "jkm_single"

    @property
    def payload(self) -> Any:
        return [self.value] if self.array else {"n": self.value}

    def opts(self) -> InsertOpts:
        return InsertOpts(
            job_key=self.key,
            job_key_mode=self.mode,
            scheduled_at=self.when,
            max_attempts=self.max_attempts,
        )


adds = st.builds(
    Add,
    key=st.sampled_from(KEYS),
    mode=st.sampled_from(
        [
            JobKeyMode.REPLACE,
            JobKeyMode.REPLACE,
            JobKeyMode.PRESERVE_RUN_AT,
            JobKeyMode.PRESERVE_RUN_AT,
            JobKeyMode.UNSAFE_DEDUPE,
        ]
    ),
    array=st.sampled_from([True, True, False]),
    value=st.integers(0, 99),
    when=st.sampled_from([None, None, *PAST, *FUTURE]),
    max_attempts=st.sampled_from([1, 2, 3]),
)


# ------------------------------------------------------------------ the model


@attrs.define
class ModelJob:
    id: int
    kind: str
    args: Any
    state: JobState
    when: When
    max_attempts: int
    key: str | None
    attempt: int = 0
    errors: int = 0
    revision: int = 0
    runs: int = 0  # run_count
    replaced: bool = False  # metadata job_key_replaced_at
    cancel_requested: bool = False  # metadata cancel_attempted_at


NEW = -1


class Model:
    def __init__(self) -> None:
        self.jobs: dict[int, ModelJob] = {}

    def holder(self, key: str) -> ModelJob | None:
        found = [job for job in self.jobs.values() if job.key == key]
        assert len(found) <= 1, f"the model gave one key to two jobs: {found}"
        return found[0] if found else None

    def in_state(self, *states: JobState) -> list[int]:
        return sorted(job.id for job in self.jobs.values() if job.state in states)

    @staticmethod
    def when_of(add: Add) -> When:
        return When.now_plus() if add.when is None else When(add.when)

    def add(self, add: Add) -> tuple[InsertAction, int]:
        """Apply one add; returns the expected action and job (NEW for a new job)."""
        holder = self.holder(add.key)
        if holder is None:
            event("add: no holder")
            return InsertAction.INSERTED, NEW
        if add.mode is JobKeyMode.UNSAFE_DEDUPE:
            event(f"add: unsafe_dedupe on {holder.state.value}")
            return InsertAction.DEDUPLICATED, holder.id
        if holder.state is JobState.RUNNING:
            event("add: running holder detached")
            holder.key = None
            holder.max_attempts = holder.attempt
            holder.replaced = True
            return InsertAction.INSERTED, NEW
        if holder.state is JobState.DISCARDED:
            event("add: discarded holder detached")
            holder.key = None
            return InsertAction.INSERTED, NEW
        failed = holder.attempt > 0
        event(f"add: {add.mode.value} of a {holder.state.value}{' failed' if failed else ''} job")
        if isinstance(holder.args, list) and add.array:
            holder.args = [*holder.args, *add.payload]
            event("add: arrays merged")
        else:
            holder.args = add.payload
        holder.kind = add.kind
        holder.max_attempts = add.max_attempts
        if failed or add.mode is JobKeyMode.REPLACE:
            holder.when = self.when_of(add)
        holder.attempt = 0
        holder.errors = 0
        holder.revision += 1
        holder.state = JobState.SCHEDULED if holder.when.future else JobState.AVAILABLE
        holder.cancel_requested = False  # the metadata is the new add's
        return InsertAction.REPLACED, holder.id

    def create(self, job_id: int, add: Add) -> None:
        assert job_id not in self.jobs, f"the database reused id {job_id}"
        when = self.when_of(add)
        self.jobs[job_id] = ModelJob(
            id=job_id,
            kind=add.kind,
            args=add.payload,
            state=JobState.SCHEDULED if when.future else JobState.AVAILABLE,
            when=when,
            max_attempts=add.max_attempts,
            key=add.key,
        )

    def finish(self, job: ModelJob, ending: Ending, delay: float | None) -> None:
        """The finish statement's rules, in its order."""
        if ending is Ending.FAILED:
            job.errors += 1
        if ending is Ending.COMPLETED:
            job.state = JobState.COMPLETED
        elif job.cancel_requested:
            job.state = JobState.CANCELLED
        elif job.replaced and ending in (Ending.SNOOZED, Ending.RETURNED):
            job.state = JobState.DISCARDED
        elif ending is Ending.SNOOZED:
            job.state = JobState.SCHEDULED
        elif ending is Ending.RETURNED:
            job.state = JobState.AVAILABLE
        elif job.attempt >= job.max_attempts:
            job.state = JobState.DISCARDED
        else:
            job.state = JobState.RETRYABLE
        if job.state in (JobState.COMPLETED, JobState.CANCELLED):
            job.key = None
        runs_again = job.state in (JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE)
        if delay is not None and runs_again:
            job.when = When.now_plus(delay)
        if ending in (Ending.SNOOZED, Ending.RETURNED) and runs_again:
            job.attempt -= 1
        event(f"finish: {ending.value} -> {job.state.value}")


# ------------------------------------------------------------------ the machine


class JobKeysMachine(RuleBasedStateMachine):
    engine: Engine  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        empty_job_table(self.engine)

    # -------------------------------------------------------------- adds

    def apply(self, batch: list[Add], results: list[tuple[Any, int, Any]]) -> None:
        """Compare ``(action, job id, returned args)`` per add with the model's prediction."""
        assert len(results) == len(batch)
        last_args: dict[int, Any] = {}
        for add, (action, job_id, args) in zip(batch, results, strict=True):
            assert action is not None and job_id is not None, "an add returned nothing"
            expected, expected_id = self.model.add(add)
            assert action is expected, f"{add}: {action}, the model says {expected}"
            if expected_id == NEW:
                self.model.create(job_id, add)
            else:
                assert job_id == expected_id, f"{add}: job {job_id}, expected {expected_id}"
            last_args[job_id] = args
        for job_id, args in last_args.items():
            assert args == self.model.jobs[job_id].args, f"job {job_id} came back with {args}"

    @initialize(batch=st.lists(adds, min_size=1, max_size=3))
    def some_jobs(self, batch: list[Add]) -> None:
        self.add_batch(batch, "insert_many")

    @rule(item=adds, path=st.sampled_from(["insert", "enqueue"]))
    def add(self, item: Add, path: str) -> None:
        self.add_batch([item], path)

    @rule(
        batch=st.lists(adds, min_size=1, max_size=3),
        repeat=st.booleans(),
        path=st.sampled_from(["insert_many", "enqueue"]),
    )
    def add_many(self, batch: list[Add], repeat: bool, path: str) -> None:
        if repeat:  # the same key again, in one batch
            batch = [*batch, attrs.evolve(batch[0], value=batch[0].value + 100)]
        self.add_batch(batch, path)

    def add_batch(self, batch: list[Add], path: str) -> None:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            if path == "insert":
                (add,) = batch
                result = sa_jobs.insert(session, add.args(), add.opts())
                assert result is not None
                results = [(result.action, result.job.id, result.job.args_json)]
            elif path == "insert_many":
                params = [InsertManyParams(add.args(), add.opts()) for add in batch]
                returned = sa_jobs.insert_many(session, params)
                results = [(r.action, r.job.id, r.job.args_json) for r in returned]
            else:
                jobs = [sa_jobs.enqueue(add.args(), add.opts()) for add in batch]
                session.add_all(jobs)
                session.flush()
                results = [(job.insert_action, job.id, job.args_json) for job in jobs]
        self.apply(batch, results)

    # -------------------------------------------------------------- a worker's steps

    @precondition(lambda self: self.model.in_state(JobState.AVAILABLE))
    @rule()
    def start(self) -> None:
        self.start_one()

    def start_one(self) -> ModelJob:
        """Fetch one job as a worker does; it must be one the model has available."""
        startable = self.model.in_state(JobState.AVAILABLE)
        fetched = fetch_jobs(self.engine, "default", 1, "machine")
        assert len(fetched) == 1, f"nothing fetched; the model has {startable} available"
        job = self.model.jobs[fetched[0].id]
        assert job.id in startable, f"started job {job.id}, a {job.state.value} one"
        job.state = JobState.RUNNING
        job.attempt += 1
        job.runs += 1
        assert (fetched[0].attempt, fetched[0].run_count) == (job.attempt, job.runs)
        event("start")
        return job

    @precondition(lambda self: self.model.in_state(JobState.AVAILABLE))
    @rule(
        ending=st.sampled_from(
            ["complete", "fail_now", "fail_later", "snooze_now", "snooze_later", "shutdown"]
        )
    )
    def work(self, ending: str) -> None:
        """A whole run: start a job and end it at once."""
        job = self.start_one()
        if ending == "complete":
            self.finish(job, Ending.COMPLETED)
        elif ending.startswith("fail"):
            self.finish(job, Ending.FAILED, 0.0 if ending == "fail_now" else HOUR)
        elif ending == "shutdown":
            self.finish(job, Ending.RETURNED)
        else:
            self.finish(job, Ending.SNOOZED, 0.0 if ending == "snooze_now" else HOUR)

    @precondition(lambda self: self.model.in_state(JobState.AVAILABLE))
    @rule(
        item=adds,
        act=st.sampled_from(["add", "add", "remove"]),
        ending=st.sampled_from([None, "complete", "fail", "snooze", "shutdown"]),
    )
    def while_running(self, item: Add, act: str, ending: str | None) -> None:
        """Start a job, add its key again (or remove it) while it runs, maybe end the run."""
        job = self.start_one()
        if job.key is not None:
            if act == "remove":
                self.remove(job.key)
            else:
                self.add_batch([attrs.evolve(item, key=job.key)], "insert")
        if ending == "complete":
            self.finish(job, Ending.COMPLETED)
        elif ending == "fail":
            self.finish(job, Ending.FAILED, 0.0)
        elif ending == "snooze":
            self.finish(job, Ending.SNOOZED, 0.0)
        elif ending == "shutdown":
            self.finish(job, Ending.RETURNED)

    @precondition(lambda self: self.model.in_state(JobState.AVAILABLE))
    @rule(item=adds, delay=st.sampled_from([0.0, HOUR]))
    def add_after_a_failure(self, item: Add, delay: float) -> None:
        """Start a job, fail it (retryable, or discarded when spent), add its key again."""
        job = self.start_one()
        self.finish(job, Ending.FAILED, delay)
        if job.key is not None:
            self.add_batch([attrs.evolve(item, key=job.key)], "insert")

    def running(self, data: st.DataObject, which: list[int]) -> ModelJob:
        return self.model.jobs[data.draw(st.sampled_from(which), label="job")]

    def finish(self, job: ModelJob, ending: Ending, delay: float | None = None) -> None:
        error = {"attempt": job.attempt, "error": "machine"} if ending is Ending.FAILED else None
        changed = finish_outcomes(self.engine, [Outcome(job.id, job.runs, ending, delay, error)])
        assert [job_id for job_id, _ in changed] == [job.id]
        self.model.finish(job, ending, delay)
        assert changed[0][1] is job.state

    @precondition(lambda self: self.model.in_state(JobState.RUNNING))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self.finish(self.running(data, self.model.in_state(JobState.RUNNING)), Ending.COMPLETED)

    @precondition(lambda self: self.model.in_state(JobState.RUNNING))
    @rule(data=st.data(), delay=st.sampled_from([0.0, HOUR]))
    def fail(self, data: st.DataObject, delay: float) -> None:
        job = self.running(data, self.model.in_state(JobState.RUNNING))
        self.finish(job, Ending.FAILED, delay)

    def spent(self) -> list[int]:
        return [
            job_id
            for job_id in self.model.in_state(JobState.RUNNING)
            if self.model.jobs[job_id].attempt >= self.model.jobs[job_id].max_attempts
        ]

    @precondition(lambda self: self.spent())
    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        """A failure of a job with no attempts left (a replaced one, or a last attempt)."""
        job = self.running(data, self.spent())
        self.finish(job, Ending.FAILED, 0.0)
        assert job.state in (JobState.DISCARDED, JobState.CANCELLED)

    @precondition(lambda self: self.model.in_state(JobState.RUNNING))
    @rule(data=st.data(), how=st.sampled_from(["snooze_now", "snooze_later", "shutdown"]))
    def interrupt(self, data: st.DataObject, how: str) -> None:
        job = self.running(data, self.model.in_state(JobState.RUNNING))
        if how == "shutdown":
            self.finish(job, Ending.RETURNED)
        else:
            self.finish(job, Ending.SNOOZED, 0.0 if how == "snooze_now" else HOUR)

    @rule()
    def schedule(self) -> None:
        promoted = run_once(self.engine, Scheduler())
        due = [
            job
            for job in self.model.jobs.values()
            if job.state in (JobState.SCHEDULED, JobState.RETRYABLE) and not job.when.future
        ]
        for job in due:
            job.state = JobState.AVAILABLE
        assert promoted == len(due)
        if due:
            event("schedule: promoted some")

    # -------------------------------------------------------------- from outside

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        with Session(self.engine) as session, session.begin():
            outcome = sa_jobs.remove_job(session, key)
        holder = self.model.holder(key)
        if holder is None:
            expected = RemoveOutcome.NOT_FOUND
        elif holder.state is JobState.RUNNING:
            expected = RemoveOutcome.WILL_NOT_RUN_AGAIN
            holder.key = None
            holder.max_attempts = holder.attempt
            holder.replaced = True
        else:
            expected = RemoveOutcome.REMOVED
            del self.model.jobs[holder.id]
        assert outcome is expected
        event(f"remove: {outcome.value}")

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.jobs)), label="job")
        with Session(self.engine) as session, session.begin():
            sa_jobs.cancel_job(session, job_id)
        job = self.model.jobs[job_id]
        if job.state in FINAL:
            return
        job.cancel_requested = True
        if job.state is not JobState.RUNNING:
            job.state = JobState.CANCELLED
            job.key = None
        event(f"cancel: {job.state.value}")

    # -------------------------------------------------------------- the check

    @invariant()
    def database_matches_the_model(self) -> None:
        with self.engine.connect() as connection:
            rows = connection.execute(text("SELECT * FROM sa_job ORDER BY id")).all()
        assert [row.id for row in rows] == sorted(self.model.jobs)
        for row in rows:
            job = self.model.jobs[row.id]
            seen = (
                row.kind,
                row.args,
                row.state,
                row.attempt,
                row.max_attempts,
                len(row.errors),
                row.job_key,
                row.revision,
                row.run_count,
                JOB_KEY_REPLACED_KEY in row.metadata,
                CANCEL_ATTEMPTED_KEY in row.metadata,
                row.finalized_at is not None,
            )
            expected = (
                job.kind,
                job.args,
                job.state.value,
                job.attempt,
                job.max_attempts,
                job.errors,
                job.key,
                job.revision,
                job.runs,
                job.replaced,
                job.cancel_requested,
                job.state in FINAL,
            )
            assert seen == expected, f"job {row.id}: database {seen}, model {expected}"
            assert job.when.matches(row.scheduled_at), (
                f"job {row.id}: scheduled_at {row.scheduled_at}, model {job.when}"
            )
        keys = [row.job_key for row in rows if row.job_key is not None]
        assert len(keys) == len(set(keys))


# A failure's shrinking can take a few minutes (Hypothesis stops shrinking at five).
@pytest.mark.timeout(900)
def test_job_keys_behave_like_the_model(machine_engine: Engine) -> None:
    JobKeysMachine.engine = machine_engine
    run_state_machine_as_test(
        JobKeysMachine,
        settings=settings(
            max_examples=examples(80),
            stateful_step_count=40,
            deadline=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
