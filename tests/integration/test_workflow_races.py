"""Workflow writes racing each other: a retry against the completions of the steps it
(or what it revives) waits on, and a step added while its dependency's failure cascades.

A retry recounts unresolved edges — of the step it retries, and of the dependents it
brings back from the cascade — while a dependency's completion may be in flight. The
completion resolves its edge and releases only dependents it sees ``pending``; the retry
counts edges it sees unresolved. Read under two snapshots, a step could be left
``pending`` behind an edge that was already resolved (``workflow_deps`` 1, nothing left
to run). Each test holds one side's transaction open at the racy point, with real
threads against the database; without the fix it names, each ends with a step stuck.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._act.complete import Ending, Outcome
from sa_jobs._table.schema import Features
from sa_jobs.worker.completer import write_outcomes
from tests.helpers import complete_now as complete
from tests.helpers import (
    fetch_one,
    finish_outcomes,
    get_job,
    job_states,
    sessions_waiting_for_a_lock,
    wait_until,
)
from tests.helpers import insert_workflow as insert


@sa_jobs.job_args(kind="wf_race_step")
class StepArgs:
    n: int = 0


def fail(engine: Engine, job: Job[Any]) -> None:
    """End a fetched job as discarded (a failure with no attempts left)."""
    with Session(engine) as session, session.begin():
        session.execute(
            text("UPDATE sa_job SET max_attempts = attempt WHERE id = :id"), {"id": job.id}
        )
    finish_outcomes(engine, [Outcome.of(job, Ending.FAILED, error={"error": "boom"})])
    assert get_job(engine, job.id).state is JobState.DISCARDED


def deps_of(engine: Engine, job_id: int) -> int | None:
    with engine.connect() as connection:
        return connection.scalar(select(Job.workflow_deps).where(Job.id == job_id))


def _join_of(a: str = "a", b: str = "b") -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow("join")
    first = wf.add(StepArgs(1), name=a)
    second = wf.add(StepArgs(2), name=b)
    wf.add(StepArgs(3), name="d", after=[first, second])
    return wf


def _retry(engine: Engine, job_id: int) -> None:
    with Session(engine) as session, session.begin():
        assert sa_jobs.retry_job(session, job_id)


def _in_thread(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _settle(engine: Engine, thread: threading.Thread, errors: list[BaseException]) -> None:
    thread.join(20)
    assert not thread.is_alive(), "the other side never finished"
    assert not errors, errors


def _run(engine: Engine, job_id: int) -> None:
    job = fetch_one(engine)
    assert job.id == job_id, (job.id, job_id)
    complete(engine, job)


def test_a_retry_that_revives_a_dependent_while_another_dependency_completes(
    engine: Engine,
) -> None:
    # d after a and b. a fails (d cancelled). b's completion is written, not committed,
    # when a's retry revives d: the retry waits for it and counts b's edge resolved.
    ids = insert(engine, _join_of()).jobs
    job_a, job_b = fetch_one(engine), fetch_one(engine)
    fail(engine, job_a)
    assert job_states(engine)[ids["d"]] is JobState.CANCELLED
    done = threading.Event()
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job_b)
        thread, errors = _in_thread(lambda: (_retry(engine, ids["a"]), done.set())[0])
        wait_until(lambda: done.is_set() or sessions_waiting_for_a_lock(engine), timeout=10)
    _settle(engine, thread, errors)
    assert job_states(engine)[ids["d"]] is JobState.PENDING
    assert deps_of(engine, ids["d"]) == 1
    _run(engine, ids["a"])
    assert job_states(engine)[ids["d"]] is JobState.AVAILABLE
    assert deps_of(engine, ids["d"]) == 0


def test_a_dependency_s_one_statement_completion_begun_during_a_revive(engine: Engine) -> None:
    # The worker completes a batch of steps in one statement, under the snapshot it took
    # when it began. Here it begins while a's retry (which revives d) holds b: once the
    # retry commits, the statement must not release d by that older snapshot (in which d
    # is cancelled) and resolve b's edge without taking it off d's count.
    ids = insert(engine, _join_of()).jobs
    job_a, job_b = fetch_one(engine), fetch_one(engine)
    fail(engine, job_a)
    with engine.connect() as connection:
        features = Features.of(connection)
    written: list[int] = []
    with Session(engine) as session, session.begin():
        assert sa_jobs.retry_job(session, ids["a"])
        thread, errors = _in_thread(
            lambda: written.append(
                write_outcomes(engine, [Outcome.of(job_b, Ending.COMPLETED)], features)
            )
        )
        wait_until(lambda: sessions_waiting_for_a_lock(engine), timeout=10)
    _settle(engine, thread, errors)
    assert written == [1]
    assert job_states(engine)[ids["b"]] is JobState.COMPLETED
    assert deps_of(engine, ids["d"]) == 1
    _run(engine, ids["a"])
    assert job_states(engine)[ids["d"]] is JobState.AVAILABLE


def test_a_retried_step_recounts_after_its_dependency_s_completion(engine: Engine) -> None:
    # s after x; s is cancelled by hand while x runs. x's completion is written, not
    # committed, when s is retried: the retry waits for it and finds nothing to wait for.
    wf = sa_jobs.Workflow("pair")
    x = wf.add(StepArgs(1), name="x")
    wf.add(StepArgs(2), name="s", after=[x], on_dependency_failure="run")
    inserted = insert(engine, wf)
    ids = inserted.jobs
    job_x = fetch_one(engine)
    with Session(engine) as session, session.begin():
        assert sa_jobs.cancel_job(session, ids["s"])
    assert job_states(engine)[ids["s"]] is JobState.CANCELLED
    done = threading.Event()
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job_x)
        thread, errors = _in_thread(lambda: (_retry(engine, ids["s"]), done.set())[0])
        wait_until(lambda: done.is_set() or sessions_waiting_for_a_lock(engine), timeout=10)
    _settle(engine, thread, errors)
    assert job_states(engine)[ids["s"]] is JobState.AVAILABLE
    assert deps_of(engine, ids["s"]) == 0


@pytest.mark.parametrize("held_first", ["a", "b"])
def test_two_retries_of_two_failed_dependencies_of_one_step_take_turns(
    engine: Engine, held_first: str
) -> None:
    # Both a and b failed; d waits on both. Two transactions retry one each at the same
    # time: each would lock its own step and then the other's, were the locks not taken
    # in one pass in id order. Neither deadlocks, and d waits for both again.
    ids = insert(engine, _join_of()).jobs
    job_a, job_b = fetch_one(engine), fetch_one(engine)
    fail(engine, job_a)
    fail(engine, job_b)
    held, other = ids[held_first], ids["b" if held_first == "a" else "a"]
    done = threading.Event()
    with Session(engine) as session, session.begin():
        assert sa_jobs.retry_job(session, held)
        thread, errors = _in_thread(lambda: (_retry(engine, other), done.set())[0])
        wait_until(lambda: done.is_set() or sessions_waiting_for_a_lock(engine), timeout=10)
    _settle(engine, thread, errors)
    states = job_states(engine)
    assert states[ids["a"]] is JobState.AVAILABLE and states[ids["b"]] is JobState.AVAILABLE
    assert states[ids["d"]] is JobState.PENDING and deps_of(engine, ids["d"]) == 2
    for _ in range(2):
        complete(engine, fetch_one(engine))
    assert job_states(engine)[ids["d"]] is JobState.AVAILABLE


def test_a_step_added_while_its_dependency_s_failure_cascades_is_cancelled(
    engine: Engine,
) -> None:
    # r, then x after r. add_to_workflow adds y after x and holds x's lock while r's
    # failure cascades: the cascade's statement waits for x, and its recursion reads the
    # edges under the snapshot it began with, without y's. y must still be cancelled.
    wf = sa_jobs.Workflow("late edge, failing")
    r = wf.add(StepArgs(1), name="r")
    wf.add(StepArgs(2), name="x", after=[r])
    inserted = insert(engine, wf)
    ids = inserted.jobs
    job_r = fetch_one(engine)
    with engine.connect() as connection:
        features = Features.of(connection)
    with Session(engine) as session, session.begin():
        added = sa_jobs.add_to_workflow(session, inserted.id, StepArgs(3), after=[ids["x"]])
        assert added.state is JobState.PENDING
        thread, errors = _in_thread(
            lambda: write_outcomes(engine, [Outcome.of(job_r, Ending.CANCELLED)], features)
        )
        wait_until(lambda: sessions_waiting_for_a_lock(engine), timeout=10)
    _settle(engine, thread, errors)
    states = job_states(engine)
    assert states[ids["r"]] is JobState.CANCELLED
    assert states[ids["x"]] is JobState.CANCELLED
    assert states[added.job_id] is JobState.CANCELLED
    reason = get_job(engine, added.job_id).metadata_["workflow_cancelled"]
    assert reason == {"because": ids["r"], "step": "r"}
    with Session(engine) as session:
        status = sa_jobs.workflow_status(session, inserted.id)
    assert status.finished and (status.unfinished, status.failed) == (0, 3)
