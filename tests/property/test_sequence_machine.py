"""A Hypothesis state machine for sequences, checked against a small in-memory model.

The machine interleaves inserts (one job, or a batch spanning sequences, each job with
its own continue flags and attempt budget), starts (the worker's fetch), completions,
failures (retryable, or discarded once attempts are spent), cancellations by the
handler, ``cancel_job`` on any job, ``retry_job`` on any job, scheduler passes and repair
passes on a real database. After every step it compares the whole job table with the
model — each job's state, attempt, attempt budget and whether it holds its sequence's
slot — and checks that no sequence has two active jobs.

**The model** keeps, per sequence key, its jobs in id order; at most one of them holds
the slot. The rules are the documented ones:

* an insert takes the slot (``available``) iff nobody holds it and nobody waits,
  otherwise it waits (``pending``); a batch is inserted in order;
* a finished holder passes the slot to the lowest pending id (made ``available``) if it
  completed, or was cancelled/discarded with the matching continue flag; otherwise it
  keeps the slot and the sequence halts;
* ``cancel_job`` cancels a waiting job without touching the slot, cancels a holder (as
  above), and only marks a running job (whose run then ends ``cancelled`` unless it
  completes);
* ``retry_job`` makes a holder ``available`` again; another job takes the slot if the
  holder is missing or finished (skipping a halted job), and otherwise waits;
* the scheduler makes (due) retryable jobs available; the repair pass never has anything
  to do, because every promotion happens where a job finishes.

One database serves every example; the table is truncated when a machine starts.
Bounded at 40 examples of 30 steps (about ten seconds).
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertManyParams, InsertOpts, JobState, SequenceOpts
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.states import FINAL_STATES
from sa_jobs._table.models import job_table
from sa_jobs.errors import JobStateError
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.producer import fetch_jobs
from tests.budget import examples
from tests.helpers import empty_job_table, finish_outcomes, run_once

KEYS = 3
ACTIVE = frozenset({JobState.AVAILABLE, JobState.RUNNING, JobState.RETRYABLE, JobState.SCHEDULED})


@sa_jobs.job_args(kind="sequence_machine.step")
class Step:
    key: int = sa_jobs.field(sequence=True)
    n: int = 0  # not part of the key


@attrs.define
class ModelJob:
    id: int
    key: int
    continue_on_cancelled: bool
    continue_on_discarded: bool
    max_attempts: int
    state: JobState
    slot: bool
    attempt: int = 0
    cancel_requested: bool = False

    @property
    def passes_slot_on(self) -> bool:
        return (
            self.state is JobState.COMPLETED
            or (self.state is JobState.CANCELLED and self.continue_on_cancelled)
            or (self.state is JobState.DISCARDED and self.continue_on_discarded)
        )


@attrs.frozen
class NewJob:
    key: int
    continue_on_cancelled: bool
    continue_on_discarded: bool
    max_attempts: int

    def params(self, n: int) -> InsertManyParams:
        opts = SequenceOpts(
            by_args=True,
            continue_on_cancelled=self.continue_on_cancelled,
            continue_on_discarded=self.continue_on_discarded,
        )
        return InsertManyParams(
            Step(self.key, n), InsertOpts(sequence=opts, max_attempts=self.max_attempts)
        )


new_jobs = st.builds(
    NewJob,
    key=st.integers(0, KEYS - 1),
    continue_on_cancelled=st.booleans(),
    continue_on_discarded=st.booleans(),
    max_attempts=st.integers(1, 2),
)


class SequenceMachine(RuleBasedStateMachine):
    engine: Engine  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, ModelJob] = {}
        self.inserted = 0
        empty_job_table(self.engine)

    # -------------------------------------------------------------- the model's rules

    def of_key(self, key: int) -> list[ModelJob]:
        return sorted((job for job in self.jobs.values() if job.key == key), key=lambda j: j.id)

    def holder(self, key: int) -> ModelJob | None:
        holders = [job for job in self.of_key(key) if job.slot]
        assert len(holders) <= 1
        return holders[0] if holders else None

    def promote(self, key: int) -> None:
        waiting = [job for job in self.of_key(key) if job.state is JobState.PENDING]
        if waiting:
            waiting[0].state = JobState.AVAILABLE
            waiting[0].slot = True

    def finished(self, job: ModelJob) -> None:
        """A job just reached a final state: pass its slot on, or halt."""
        if job.slot and job.passes_slot_on:
            job.slot = False
            self.promote(job.key)

    def model_insert(self, job_id: int, new: NewJob) -> None:
        busy = self.holder(new.key) is not None or any(
            job.state is JobState.PENDING for job in self.of_key(new.key)
        )
        self.jobs[job_id] = ModelJob(
            id=job_id,
            key=new.key,
            continue_on_cancelled=new.continue_on_cancelled,
            continue_on_discarded=new.continue_on_discarded,
            max_attempts=new.max_attempts,
            state=JobState.PENDING if busy else JobState.AVAILABLE,
            slot=not busy,
        )

    def in_state(self, *states: JobState) -> list[ModelJob]:
        return sorted((j for j in self.jobs.values() if j.state in states), key=lambda j: j.id)

    # -------------------------------------------------------------- rules

    @rule(new=new_jobs, path=st.sampled_from(["insert", "enqueue"]))
    def insert_one(self, new: NewJob, path: str) -> None:
        self.inserted += 1
        params = new.params(self.inserted)
        with Session(self.engine) as session, session.begin():
            if path == "insert":
                job = sa_jobs.insert(session, params.args, params.opts).job
            else:
                job = sa_jobs.enqueue(params.args, params.opts)
                session.add(job)
                session.flush()
            job_id = job.id
        assert all(job_id > known for known in self.jobs)
        self.model_insert(job_id, new)

    @rule(batch=st.lists(new_jobs, min_size=2, max_size=5))
    def insert_batch(self, batch: list[NewJob]) -> None:
        params = []
        for new in batch:
            self.inserted += 1
            params.append(new.params(self.inserted))
        with Session(self.engine) as session, session.begin():
            ids = [result.job.id for result in sa_jobs.insert_many(session, params)]
        assert ids == sorted(ids)
        for job_id, new in zip(ids, batch, strict=True):
            self.model_insert(job_id, new)

    @rule(limit=st.integers(1, 4))
    def start(self, limit: int) -> None:
        available = {job.id for job in self.in_state(JobState.AVAILABLE)}
        fetched = fetch_jobs(self.engine, "default", limit, "machine")
        assert len(fetched) == min(limit, len(available))
        for job in fetched:
            assert job.id in available, f"fetched job {job.id}, not available in the model"
            model = self.jobs[job.id]
            model.state = JobState.RUNNING
            model.attempt += 1
            assert job.attempt == model.attempt

    def _end_run(self, job: ModelJob, ending: Ending) -> None:
        # The machine never snoozes or returns a job, so its attempt is its run count.
        changed = finish_outcomes(self.engine, [Outcome(job.id, job.attempt, ending, delay=0.0)])
        if ending is Ending.COMPLETED:
            job.state = JobState.COMPLETED
        elif ending is Ending.CANCELLED or job.cancel_requested:
            job.state = JobState.CANCELLED
        elif job.attempt >= job.max_attempts:
            job.state = JobState.DISCARDED
        else:
            job.state = JobState.RETRYABLE
        assert changed == [(job.id, job.state)]
        if job.state in FINAL_STATES:
            self.finished(job)

    @precondition(lambda self: self.in_state(JobState.RUNNING))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self._end_run(data.draw(st.sampled_from(self.in_state(JobState.RUNNING))), Ending.COMPLETED)

    @precondition(lambda self: self.in_state(JobState.RUNNING))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        self._end_run(data.draw(st.sampled_from(self.in_state(JobState.RUNNING))), Ending.FAILED)

    @precondition(lambda self: self.in_state(JobState.RUNNING))
    @rule(data=st.data())
    def cancelled_by_its_handler(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobState.RUNNING)))
        self._end_run(job, Ending.CANCELLED)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            returned = sa_jobs.cancel_job(session, job.id)
        if job.state is JobState.RUNNING:
            job.cancel_requested = True
        elif job.state not in FINAL_STATES:
            job.state = JobState.CANCELLED
            self.finished(job)
        assert returned.state is job.state

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            if job.state is JobState.RUNNING:
                with pytest.raises(JobStateError):
                    sa_jobs.retry_job(session, job.id)
                return
            returned = sa_jobs.retry_job(session, job.id)
        job.cancel_requested = False
        if job.attempt >= job.max_attempts:
            job.max_attempts = job.attempt + 1
        holder = self.holder(job.key)
        if job.slot:
            job.state = JobState.AVAILABLE
        elif holder is None or holder.state in FINAL_STATES:
            if holder is not None:
                holder.slot = False
            job.slot = True
            job.state = JobState.AVAILABLE
        else:
            job.state = JobState.PENDING
        assert returned.state is job.state

    @rule()
    def scheduler_pass(self) -> None:
        promoted = run_once(self.engine, Scheduler())
        retryable = self.in_state(JobState.RETRYABLE)
        assert promoted == len(retryable)
        for job in retryable:
            job.state = JobState.AVAILABLE

    @rule()
    def repair_pass(self) -> None:
        assert run_once(self.engine, SequenceRepair()) == 0

    # -------------------------------------------------------------- invariants

    @invariant()
    def the_table_matches_the_model(self) -> None:
        columns = (
            job_table.c.id,
            job_table.c.state,
            job_table.c.sequence_slot,
            job_table.c.attempt,
            job_table.c.max_attempts,
        )
        with self.engine.connect() as connection:
            rows = connection.execute(select(*columns).order_by(job_table.c.id)).all()
        actual = {
            row.id: (row.state, row.sequence_slot, row.attempt, row.max_attempts) for row in rows
        }
        expected = {
            job.id: (job.state, job.slot, job.attempt, job.max_attempts)
            for job in self.jobs.values()
        }
        assert actual == expected

    @invariant()
    def at_most_one_active_job_per_sequence(self) -> None:
        with self.engine.connect() as connection:
            crowded = connection.execute(
                select(job_table.c.sequence_key)
                .where(job_table.c.state.in_(ACTIVE))
                .group_by(job_table.c.sequence_key)
                .having(func.count() > 1)
            ).all()
        assert crowded == []
        for key in range(KEYS):
            active = [job.id for job in self.of_key(key) if job.state in ACTIVE]
            assert len(active) <= 1, f"sequence {key} has active jobs {active}"
            holder = self.holder(key)
            if active:
                assert holder is not None and holder.id == active[0]


def test_sequences_behave_like_the_model(engine: Engine) -> None:
    SequenceMachine.engine = engine
    run_state_machine_as_test(
        SequenceMachine,
        settings=settings(
            max_examples=examples(40),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
