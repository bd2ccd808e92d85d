"""A Hypothesis state machine for unique jobs, checked against a small in-memory model.

The machine interleaves inserts (every path, one job or a batch with duplicates),
starts, completions, failures (retryable, or discarded once attempts are spent),
cancels, manual retries, scheduler passes and clock moves on a real database, and after
every step compares the whole job table with the model: each job's kind, state,
attempt, whether it holds its key, which jobs share a key, and the conflict recorded
when the scheduler discards one. Every insert's result (new, or skipped with which
existing job) must be the one the model predicts.

**The model** keeps, per job, the options that matter (its key, its blocking states,
its TTL deadline, ``until="start"``) and applies the documented rules:

* a job *holds* its key while it has one and its state is one of its unique states;
  an insert is skipped iff some job holds its key, after the holders whose TTL has
  passed let go of it (they keep running, without a key);
* a batch folds its own duplicates: the first wins, the others get its job;
* starting an ``until="start"`` job drops its key for good;
* the scheduler promotes due jobs; a due job that does not hold its key (retryable
  while ``retryable`` is not one of its states) and finds it held is discarded, and of
  several such jobs wanting a free key the oldest wins;
* ``retry_job`` fails with ``UniqueConflictError`` when another job holds the key.

**Clock moves** do not sleep: "Δ passes" is done by moving every stored time of every
job back by Δ (``scheduled_at``, ``unique_expires_at``, ``attempted_at``,
``created_at``, ``finalized_at``). Everything sa_jobs decides compares a stored time
with ``now()`` (due for fetch, due for the scheduler, TTL expired) or orders by stored
times, so shifting all of them back is indistinguishable from the database clock
jumping forward — the one exception is ``by_period`` with no ``scheduled_at`` (the key
uses the inserting process's clock), so the machine always gives ``by_period`` jobs an
explicit ``scheduled_at``. Model times are whole minutes; moves are multiples of ten
minutes and the few seconds of real time a run takes never reach a boundary. The
model counts ``now - deadline >= 0`` as passed, and the database agrees on ties because
real time only adds a little to ``now()``.

One throwaway database serves every example; the table is truncated when a machine
starts. Bounded at 60 runs of up to 30 steps (about ten seconds).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as conjecture_engine
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
from sa_jobs import InsertManyParams, InsertOpts, JobState, UniqueOpts
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.states import UNIQUE_CONFLICT_KEY
from sa_jobs._declare.args import kind_of
from sa_jobs._declare.options import REQUIRED_UNIQUE_STATES
from sa_jobs._declare.unique_sequence_keys import period_start_us
from sa_jobs.errors import JobStateError, UniqueConflictError
from sa_jobs.worker.maintenance.scheduler import Scheduler
from tests.budget import examples
from tests.helpers import (
    empty_job_table,
    fetch_one,
    finish_outcomes,
    insert_through,
    run_once,
)

# ------------------------------------------------------------------ the jobs


@sa_jobs.job_args(kind="machine.account")
class Account:
    account: int = sa_jobs.field(unique=True)
    note: str = ""  # not part of the key


@sa_jobs.job_args(kind="machine.other", unique=UniqueOpts(by_args=True))
class Other:
    account: int = 0  # no marked field: all args count


KINDS: dict[str, type] = {"machine.account": Account, "machine.other": Other}

PERIOD = dt.timedelta(minutes=30)
#: by_period jobs get one of these (past) times, so their bucket never depends on the clock.
PERIOD_TIMES = (
    dt.datetime(2020, 1, 1, 0, 0, tzinfo=dt.UTC),
    dt.datetime(2020, 1, 1, 0, 10, tzinfo=dt.UTC),
    dt.datetime(2020, 1, 1, 0, 29, 59, 999_999, tzinfo=dt.UTC),
    dt.datetime(2020, 1, 1, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=9))),  # 00:30 UTC
    dt.datetime(2020, 1, 1, 0, 45, tzinfo=dt.UTC),
)
TTL_MINUTES = 60
DELAY_MINUTES = 30
MAX_ATTEMPTS = 2

#: The option sets the machine draws from. ``None`` leaves the kind's default in force
#: (by_args for machine.other, nothing for machine.account).
OPTION_SETS: dict[str, UniqueOpts | None] = {
    "by_args": UniqueOpts(by_args=True),
    "no_retryable": UniqueOpts(
        by_args=True, by_state=REQUIRED_UNIQUE_STATES | {JobState.COMPLETED}
    ),
    "active_only": UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES),
    "by_queue": UniqueOpts(by_queue=True),
    "by_period": UniqueOpts(by_args=True, by_period=PERIOD),
    "ttl": UniqueOpts(by_args=True, ttl=dt.timedelta(minutes=TTL_MINUTES)),
    "until_start": UniqueOpts(by_args=True, until="start"),
    "exclude_kind": UniqueOpts(by_args=True, exclude_kind=True),
    "none": UniqueOpts(),
    "kind_default": None,
}

QUEUES = ("q1", "q2")
FINAL = {JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED}


@attrs.frozen
class Item:
    """One insert request as drawn."""

    kind: str
    account: int
    note: str
    option_set: str
    queue: str
    #: Minutes from now until due (None: now); by_period items use ``period_time``.
    delay: int | None
    period_time: int

    def args(self) -> object:
        if self.kind == "machine.account":
            return Account(self.account, self.note)
        return Other(self.account)

    def opts(self) -> InsertOpts:
        unique = OPTION_SETS[self.option_set]
        scheduled_at = None
        if unique is not None and unique.by_period is not None:
            scheduled_at = PERIOD_TIMES[self.period_time]
        elif self.delay is not None:
            scheduled_at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=self.delay)
        return InsertOpts(
            queue=self.queue, max_attempts=MAX_ATTEMPTS, scheduled_at=scheduled_at, unique=unique
        )


#: Option sets whose keys collide (kind and account) are drawn more often: the
#: interesting cases are jobs with different options competing for one key.
SHARED_KEY_SETS = ["by_args", "no_retryable", "active_only", "ttl", "until_start"]

items = st.builds(
    Item,
    kind=st.sampled_from(["machine.account", "machine.account", "machine.other"]),
    account=st.sampled_from([1, 1, 2]),
    note=st.sampled_from(["x", "y"]),
    option_set=st.one_of(st.sampled_from(SHARED_KEY_SETS), st.sampled_from(list(OPTION_SETS))),
    queue=st.sampled_from(QUEUES),
    delay=st.sampled_from([None, None, DELAY_MINUTES]),
    period_time=st.integers(0, len(PERIOD_TIMES) - 1),
)


# ------------------------------------------------------------------ the model


@attrs.define
class ModelJob:
    id: int
    kind: str
    queue: str
    key: tuple[Any, ...] | None
    states: frozenset[JobState]
    until_start: bool
    expires: int | None  # model minutes
    state: JobState
    due: int  # model minutes (scheduled_at)
    attempt: int = 0
    max_attempts: int = MAX_ATTEMPTS
    cancel_requested: bool = False
    conflict_with: int | None = None

    @property
    def holds(self) -> bool:
        return self.key is not None and self.state in self.states


def resolved_unique(item: Item) -> UniqueOpts | None:
    """The item's UniqueOpts: its option set's, else its kind's default."""
    unique = OPTION_SETS[item.option_set]
    if unique is None:
        unique = kind_of(KINDS[item.kind]).defaults.unique
    return unique


def model_key(item: Item) -> tuple[Any, ...] | None:
    """The model's own idea of the key (independent of sa_jobs._declare.unique_sequence_keys)."""
    unique = resolved_unique(item)
    if unique is None or unique.is_empty:
        return None
    period = None
    if unique.by_period is not None:
        period = period_start_us(PERIOD_TIMES[item.period_time], unique.by_period)
    return (
        None if unique.exclude_kind else item.kind,
        # Account's marked subset and Other's whole args are both {"account": n}.
        item.account if unique.by_args else None,
        period,
        item.queue if unique.by_queue else None,
    )


NEW = -1


class Model:
    def __init__(self) -> None:
        self.jobs: dict[int, ModelJob] = {}
        self.now = 0

    def holder(self, key: tuple[Any, ...], other_than: int | None = None) -> ModelJob | None:
        found = [j for j in self.jobs.values() if j.key == key and j.holds and j.id != other_than]
        assert len(found) <= 1, f"the model itself broke uniqueness: {found}"
        return found[0] if found else None

    def predict_batch(self, batch: list[Item]) -> list[tuple[int, bool]]:
        """``(existing job id or NEW or -(index of the batch's first)-2, skipped)`` per item,
        releasing expired TTL holders of the batch's keys first."""
        keys = {model_key(item) for item in batch} - {None}
        for job in self.jobs.values():
            expired = job.expires is not None and job.expires <= self.now
            if job.key in keys and job.holds and expired:
                job.key = None
                event("insert: an expired TTL lets go")
        first_with_key: dict[tuple[Any, ...], int] = {}
        predictions: list[tuple[int, bool]] = []
        for index, item in enumerate(batch):
            key = model_key(item)
            if key is not None and key in first_with_key:
                predictions.append((-first_with_key[key] - 2, True))
                continue
            if key is not None:
                first_with_key[key] = index
                holder = self.holder(key)
                if holder is not None:
                    predictions.append((holder.id, True))
                    continue
            predictions.append((NEW, False))
        return predictions

    def add(self, job_id: int, item: Item) -> None:
        assert job_id not in self.jobs, f"the database reused id {job_id}"
        unique = resolved_unique(item)
        by_period = unique is not None and unique.by_period is not None
        due = -(10**9) if by_period else self.now + (item.delay or 0)  # by_period: long past
        ttl = unique.ttl if unique is not None else None
        self.jobs[job_id] = ModelJob(
            id=job_id,
            kind=item.kind,
            queue=item.queue,
            key=model_key(item),
            states=unique.states if unique is not None else frozenset(),
            until_start=unique is not None and unique.until == "start",
            expires=None if ttl is None else due + int(ttl.total_seconds()) // 60,
            state=JobState.SCHEDULED if due > self.now else JobState.AVAILABLE,
            due=due,
        )

    def start(self, job: ModelJob) -> None:
        job.state = JobState.RUNNING
        job.attempt += 1
        if job.until_start and job.key is not None:
            job.key = None
            event("start: until_start lets go")

    def fail(self, job: ModelJob, delay: int) -> None:
        if job.cancel_requested:
            job.state = JobState.CANCELLED
        elif job.attempt >= job.max_attempts:
            job.state = JobState.DISCARDED
        else:
            job.state = JobState.RETRYABLE
            job.due = self.now + delay

    def cancel(self, job: ModelJob) -> None:
        if job.state in FINAL:
            return
        job.cancel_requested = True
        if job.state is not JobState.RUNNING:
            job.state = JobState.CANCELLED

    def retry(self, job: ModelJob) -> int | None:
        """Apply ``retry_job``; return the holder's id when it must fail with a conflict."""
        if job.key is not None:
            holder = self.holder(job.key, other_than=job.id)
            if holder is not None:
                return holder.id
        job.state = JobState.AVAILABLE
        job.due = self.now
        job.cancel_requested = False
        if job.attempt >= job.max_attempts:
            job.max_attempts = job.attempt + 1
        return None

    def schedule(self) -> int:
        """One scheduler pass; returns how many jobs became available."""
        due = [
            j
            for j in self.jobs.values()
            if j.state in (JobState.SCHEDULED, JobState.RETRYABLE) and j.due <= self.now
        ]
        taken_by: dict[int, int | None] = {}
        for job in due:
            if job.key is None or job.holds:
                taken_by[job.id] = None
                continue
            first = min(j.id for j in due if j.key == job.key and not j.holds)
            if first != job.id:
                taken_by[job.id] = first
            else:
                holder = self.holder(job.key, other_than=job.id)
                taken_by[job.id] = holder.id if holder is not None else None
        for job in due:
            conflict = taken_by[job.id]
            if conflict is None:
                job.state = JobState.AVAILABLE
            else:
                job.state = JobState.DISCARDED
                job.conflict_with = conflict
                event("schedule: discarded for a taken key")
        return sum(1 for conflict in taken_by.values() if conflict is None)


# ------------------------------------------------------------------ the machine


class UniqueJobsMachine(RuleBasedStateMachine):
    engine: Engine  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        empty_job_table(self.engine)

    # -------------------------------------------------------------- inserts

    def check_results(self, batch: list[Item], results: list[tuple[int, bool]]) -> None:
        predictions = self.model.predict_batch(batch)
        assert len(results) == len(batch)
        for index, ((expected, skip), (job_id, skipped), item) in enumerate(
            zip(predictions, results, batch, strict=True)
        ):
            assert skipped is skip, f"item {index} ({item}): skipped={skipped}, expected {skip}"
            outcome = "new" if expected == NEW else "folded" if expected < 0 else "skipped"
            event(f"insert: {outcome}")
            if expected == NEW:
                self.model.add(job_id, item)
            elif expected >= 0:
                assert job_id == expected, f"item {index}: got job {job_id}, expected {expected}"
            else:  # folded into an earlier item of this batch
                assert job_id == results[-expected - 2][0], f"item {index} not folded"

    @rule(item=items, path=st.sampled_from(["insert", "enqueue", "insert_job", "insert_many"]))
    def insert(self, item: Item, path: str) -> None:
        if path == "insert_many":  # the item's own options, as a batch item carries them
            with Session(self.engine) as session, session.begin():
                (result,) = sa_jobs.insert_many(
                    session, [InsertManyParams(item.args(), item.opts())]
                )
                outcome = (result.job.id, result.unique_skipped_as_duplicate)
        else:
            outcome = insert_through(self.engine, path, item.args(), opts=item.opts())
        self.check_results([item], [outcome])

    @initialize(batch=st.lists(items, min_size=1, max_size=3))
    def some_jobs(self, batch: list[Item]) -> None:
        """Every run starts with a few jobs, so the transitions have something to act on."""
        self.insert_batch(batch, repeat_first=False, path="insert_many")

    @rule(
        batch=st.lists(items, min_size=1, max_size=3),
        repeat_first=st.booleans(),
        path=st.sampled_from(["insert_many", "enqueue"]),
    )
    def insert_batch(self, batch: list[Item], repeat_first: bool, path: str) -> None:
        if repeat_first:
            batch = [*batch, attrs.evolve(batch[0], note="repeat")]
        with Session(self.engine) as session, session.begin():
            if path == "insert_many":
                params = [InsertManyParams(item.args(), item.opts()) for item in batch]
                results = sa_jobs.insert_many(session, params)
                outcome = [(r.job.id, r.unique_skipped_as_duplicate) for r in results]
            else:
                jobs = [sa_jobs.enqueue(item.args(), item.opts()) for item in batch]
                session.add_all(jobs)
                session.flush()
                outcome = [(job.id, job.unique_skipped_as_duplicate) for job in jobs]
        self.check_results(batch, outcome)

    # -------------------------------------------------------------- transitions

    def jobs_in(self, *states: JobState) -> list[int]:
        return sorted(j.id for j in self.model.jobs.values() if j.state in states)

    def retryable_ids(self) -> list[int]:
        """Jobs worth a manual retry: all but the available ones (running ones must fail)."""
        return sorted(set(self.model.jobs) - set(self.jobs_in(JobState.AVAILABLE)))

    def start_one(self, data: st.DataObject) -> int:
        """Fetch one job from a queue that has some, as a worker does; returns its id."""
        queues = sorted({self.model.jobs[i].queue for i in self.jobs_in(JobState.AVAILABLE)})
        queue = data.draw(st.sampled_from(queues), label="queue")
        fetched = fetch_one(self.engine, queue, "machine")
        startable = {
            j.id
            for j in self.model.jobs.values()
            if j.state is JobState.AVAILABLE and j.queue == queue
        }
        assert fetched.id in startable
        event("start: a job")
        self.model.start(self.model.jobs[fetched.id])
        return fetched.id

    @precondition(lambda self: self.jobs_in(JobState.AVAILABLE))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.start_one(data)

    @precondition(lambda self: self.jobs_in(JobState.AVAILABLE))
    @rule(data=st.data(), delay=st.sampled_from([0, 0, DELAY_MINUTES, None]))
    def work(self, data: st.DataObject, delay: int | None) -> None:
        """A whole attempt: start a job, then complete it (``None``) or fail it."""
        job_id = self.start_one(data)
        if delay is None:
            self.finish(job_id, Ending.COMPLETED)
            self.model.jobs[job_id].state = JobState.COMPLETED
        else:
            self.finish(job_id, Ending.FAILED, delay)
            self.model.fail(self.model.jobs[job_id], delay)
            event(f"fail: {self.model.jobs[job_id].state.value}")

    def finish(self, job_id: int, ending: Ending, delay: int | None = None) -> None:
        job = self.model.jobs[job_id]
        seconds = None if delay is None else delay * 60.0
        error = {"attempt": job.attempt, "error": "machine"} if ending is Ending.FAILED else None
        # The machine never snoozes or returns a job, so its attempt is its run count.
        outcome = Outcome(job_id, job.attempt, ending, delay=seconds, error=error)
        assert len(finish_outcomes(self.engine, [outcome])) == 1

    @precondition(lambda self: self.jobs_in(JobState.RUNNING))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs_in(JobState.RUNNING)), label="job")
        self.finish(job_id, Ending.COMPLETED)
        self.model.jobs[job_id].state = JobState.COMPLETED

    @precondition(lambda self: self.jobs_in(JobState.RUNNING))
    @rule(data=st.data(), delay=st.sampled_from([0, DELAY_MINUTES]))
    def fail(self, data: st.DataObject, delay: int) -> None:
        job_id = data.draw(st.sampled_from(self.jobs_in(JobState.RUNNING)), label="job")
        self.finish(job_id, Ending.FAILED, delay)
        self.model.fail(self.model.jobs[job_id], delay)
        event(f"fail: {self.model.jobs[job_id].state.value}")

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.jobs)), label="job")
        with Session(self.engine) as session, session.begin():
            sa_jobs.cancel_job(session, job_id)
        self.model.cancel(self.model.jobs[job_id])

    @precondition(lambda self: self.retryable_ids())
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.retryable_ids()), label="job")
        job = self.model.jobs[job_id]
        with Session(self.engine) as session, session.begin():
            if job.state is JobState.RUNNING:
                with pytest.raises(JobStateError):
                    sa_jobs.retry_job(session, job_id)
                return
            holder = self.model.retry(job)
            if holder is None:
                event("retry: done")
                assert sa_jobs.retry_job(session, job_id).state is JobState.AVAILABLE
                return
            event("retry: unique conflict")
            with pytest.raises(UniqueConflictError) as caught:
                sa_jobs.retry_job(session, job_id)
            assert caught.value.holder_id == holder

    @rule()
    def schedule(self) -> None:
        promoted = run_once(self.engine, Scheduler())
        assert promoted == self.model.schedule()
        if promoted:
            event("schedule: promoted some")

    @rule(minutes=st.sampled_from([10, 30, 60, 60]))
    def clock_moves(self, minutes: int) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE sa_job SET scheduled_at = scheduled_at - make_interval(mins => :m), "
                    "unique_expires_at = unique_expires_at - make_interval(mins => :m), "
                    "attempted_at = attempted_at - make_interval(mins => :m), "
                    "created_at = created_at - make_interval(mins => :m), "
                    "finalized_at = finalized_at - make_interval(mins => :m)"
                ),
                {"m": minutes},
            )
        self.model.now += minutes

    # -------------------------------------------------------------- the check

    @invariant()
    def database_matches_the_model(self) -> None:
        with self.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT id, kind, state::text AS state, attempt, max_attempts, unique_key, "
                    "(unique_key IS NOT NULL AND sa_job_state_in_bitmask(unique_states, state))"
                    " AS holds, metadata FROM sa_job ORDER BY id"
                )
            ).all()
        model = self.model.jobs
        assert [row.id for row in rows] == sorted(model)
        db_groups: dict[bytes, set[int]] = {}
        model_groups: dict[tuple[Any, ...], set[int]] = {}
        for row in rows:
            job = model[row.id]
            seen = (
                row.kind,
                row.state,
                row.attempt,
                row.max_attempts,
                bool(row.holds),
                row.unique_key is None,
                "cancel_attempted_at" in row.metadata,
                (row.metadata.get(UNIQUE_CONFLICT_KEY) or {}).get("key_held_by_job"),
            )
            expected = (
                job.kind,
                job.state.value,
                job.attempt,
                job.max_attempts,
                job.holds,
                job.key is None,
                job.cancel_requested,
                job.conflict_with,
            )
            assert seen == expected, f"job {row.id}: database {seen}, model {expected}"
            if row.unique_key is not None:
                db_groups.setdefault(bytes(row.unique_key), set()).add(row.id)
            if job.key is not None:
                model_groups.setdefault(job.key, set()).add(row.id)
        # Jobs share a key in the database exactly when they do in the model.
        assert sorted(map(sorted, db_groups.values())) == sorted(map(sorted, model_groups.values()))


def test_unique_jobs_behave_like_the_model(
    machine_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each replay costs database round trips: Hypothesis would shrink a failure for up to
    # five minutes (its internal limit). One minute gives a short enough example and keeps
    # the report well inside the suite's per-test timeout.
    monkeypatch.setattr(conjecture_engine, "MAX_SHRINKING_SECONDS", 60, raising=False)
    UniqueJobsMachine.engine = machine_engine
    run_state_machine_as_test(
        UniqueJobsMachine,
        settings=settings(
            max_examples=examples(60),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
