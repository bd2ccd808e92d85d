"""A Hypothesis state machine for fair and key-limited fetches on the real server.

Each example draws a queue's settings — a concurrency limit per key (or none), a rate
limit per key (or none), weights for some keys — and two fetchers (two processes, each
with its own cursor). The steps interleave arrivals (a batch of jobs for a key), fetches
of random sizes by either fetcher, and completions of random running jobs. After every
step: no key has more running jobs than its limit, nor more starts than its rate allows;
and a fetch with room for every key that has available jobs and is under its limits took
from each of them (round-robin). At the end everything runs: the running jobs finish and
the fetchers drain the queue, until every job has completed — but for the jobs a key's
rate limit holds back, exactly those past its ``max_starts``.

One database serves every example; the tables are emptied when a machine starts.
Bounded at 20 examples of 20 steps (about 40 s on a loaded 2-core machine).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit, JobState, RateLimit
from sa_jobs._declare.limits import Limit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import plan_limits
from tests.helpers import empty_job_table

KEYS = ["a", "b", "c", "d", "e"]
QUEUE = "fair_machine"


@sa_jobs.job_args(kind="test_fair_machine", queue=QUEUE, partition_by=["tenant"])
class TenantJob:
    tenant: str


class FairMachine(RuleBasedStateMachine):
    engine: Engine

    @initialize(
        max_running=st.none() | st.integers(1, 3),
        max_starts=st.none() | st.integers(2, 8),
        weights=st.dictionaries(st.sampled_from(KEYS), st.integers(1, 3), max_size=3),
    )
    def configure(
        self, max_running: int | None, max_starts: int | None, weights: dict[str, int]
    ) -> None:
        empty_job_table(self.engine)
        self.max_running = max_running
        self.max_starts = max_starts
        limits: list[Limit] = []
        if max_running is not None:
            limits.append(ConcurrencyLimit(max_running, queue=QUEUE, by_args=["tenant"]))
        if max_starts is not None:
            per = dt.timedelta(hours=1)
            limits.append(RateLimit(max_starts, per, queue=QUEUE, by_args=["tenant"]))
        plan = plan_limits(limits, [QUEUE]).get(QUEUE)
        self.fetchers = [KeyedQueue(QUEUE, plan, dict(weights)) for _ in range(2)]
        self.inserted: Counter[str] = Counter()

    def _by_key(self, *conditions: Any) -> Counter[str]:
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(Job.partition_key, func.count())
                .where(*conditions)
                .group_by(Job.partition_key)
            )
            return Counter({key: n for key, n in rows})

    def _eligible(self) -> set[str]:
        """Keys with available jobs that their limits let start one more."""
        available = self._by_key(Job.state == JobState.AVAILABLE)
        running = self._by_key(Job.state == JobState.RUNNING)
        started = self._by_key(Job.attempt > 0)
        return {
            key
            for key in available
            if (self.max_running is None or running[key] < self.max_running)
            and (self.max_starts is None or started[key] < self.max_starts)
        }

    @rule(key=st.sampled_from(KEYS), count=st.integers(1, 6))
    def arrive(self, key: str, count: int) -> None:
        with Session(self.engine) as session, session.begin():
            sa_jobs.insert_many(session, [TenantJob(key)] * count)
        self.inserted[key] += count

    @rule(fetcher=st.integers(0, 1), free=st.integers(1, 8))
    def fetch(self, fetcher: int, free: int) -> None:
        eligible = self._eligible()
        jobs = fetch_keyed(
            self.engine, self.fetchers[fetcher], free, "machine", features=ALL_FEATURES
        )
        assert len(jobs) <= free
        taken = {job.partition_key for job in jobs}
        if free >= len(eligible):
            # Room for every key that may start one: each got its turn.
            assert eligible <= taken, (eligible, taken)
        if eligible:
            assert jobs, "a key could start a job and the fetch took none"

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        with self.engine.connect() as connection:
            running = list(connection.scalars(select(Job.id).where(Job.state == JobState.RUNNING)))
        if not running:
            return
        done = data.draw(st.lists(st.sampled_from(running), unique=True, min_size=1))
        self._complete(done)

    def _complete(self, ids: list[int]) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                update(Job)
                .where(Job.id.in_(ids))
                .values(state=JobState.COMPLETED, finalized_at=func.now())
            )

    @invariant()
    def no_key_over_its_limits(self) -> None:
        if not hasattr(self, "fetchers"):
            return
        if self.max_running is not None:
            running = self._by_key(Job.state == JobState.RUNNING)
            assert max(running.values(), default=0) <= self.max_running, running
        if self.max_starts is not None:
            started = self._by_key(Job.attempt > 0)
            assert max(started.values(), default=0) <= self.max_starts, started

    def teardown(self) -> None:
        if not hasattr(self, "fetchers"):
            return
        # Everything eventually runs: finish what runs, fetch again, until nothing moves.
        for _ in range(500):
            with self.engine.connect() as connection:
                running = list(
                    connection.scalars(select(Job.id).where(Job.state == JobState.RUNNING))
                )
            self._complete(running)
            fetched = sum(
                len(fetch_keyed(self.engine, f, 5, "machine", features=ALL_FEATURES))
                for f in self.fetchers
            )
            if not fetched and not running:
                break
        completed = self._by_key(Job.state == JobState.COMPLETED)
        for key, count in self.inserted.items():
            expected = count if self.max_starts is None else min(count, self.max_starts)
            assert completed[key] == expected, (key, count, completed)


@pytest.mark.usefixtures("no_workers_or_leader")
def test_fair_and_key_limited_fetches_hold_their_limits_and_run_everything(
    engine: Engine,
) -> None:
    FairMachine.engine = engine
    run_state_machine_as_test(
        FairMachine,
        settings=settings(
            max_examples=20,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
