"""Workflows: steps start only after their dependencies completed, released exactly once
in the transaction that completed the last one; failures cascade; callbacks fire once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._act.complete import Ending, Outcome
from sa_jobs._table.workflow_tables import workflow_table
from sa_jobs.errors import InvalidWorkflowError
from tests.forked import process_context
from tests.helpers import complete_now as complete
from tests.helpers import (
    fetch_one,
    finish_outcomes,
    get_job,
    job_states,
    make_worker,
    sessions_waiting_for_a_lock,
    wait_until,
)
from tests.helpers import insert_workflow as insert


@sa_jobs.job_args(kind="wf_step")
class StepArgs:
    n: int = 0


@sa_jobs.job_args(kind="wf_other")
class Other:
    n: int = 0


def deps_of(engine: Engine, job_id: int) -> int | None:
    with engine.connect() as connection:
        return connection.scalar(select(Job.workflow_deps).where(Job.id == job_id))


def diamond() -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow("diamond")
    a = wf.add(StepArgs(1), name="a")
    b = wf.add(StepArgs(2), name="b", after=[a])
    c = wf.add(StepArgs(3), name="c", after=[a])
    wf.add(StepArgs(4), name="d", after=[b, c])
    return wf


def test_steps_wait_as_pending_and_are_released_in_the_completing_transaction(
    engine: Engine,
) -> None:
    inserted = insert(engine, diamond())
    ids = inserted.jobs
    states = job_states(engine)
    assert states[ids["a"]] is JobState.AVAILABLE
    assert {states[ids[n]] for n in "bcd"} == {JobState.PENDING}

    a = fetch_one(engine)
    assert a.id == ids["a"]
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, a)
        # Released inside the same transaction, before commit.
        inside = dict(
            session.execute(select(Job.id, Job.state).where(Job.id.in_(ids.values()))).all()
        )
        assert inside[ids["b"]] is JobState.AVAILABLE and inside[ids["c"]] is JobState.AVAILABLE
        assert inside[ids["d"]] is JobState.PENDING
    b = fetch_one(engine)
    complete(engine, b)
    assert job_states(engine)[ids["d"]] is JobState.PENDING  # still waits for c
    c = fetch_one(engine)
    complete(engine, c)
    assert job_states(engine)[ids["d"]] is JobState.AVAILABLE
    assert deps_of(engine, ids["d"]) == 0


def test_complete_in_rolled_back_releases_nothing(engine: Engine) -> None:
    ids = insert(engine, diamond()).jobs
    a = fetch_one(engine)
    with Session(engine) as session:
        sa_jobs.complete_in(session, a)
        session.rollback()
    states = job_states(engine)
    assert states[ids["a"]] is JobState.RUNNING
    assert {states[ids[n]] for n in "bcd"} == {JobState.PENDING}
    assert deps_of(engine, ids["d"]) == 2


def test_a_worker_runs_a_workflow_in_dependency_order(engine: Engine) -> None:
    order: list[str] = []
    worker = make_worker(engine)

    @worker.handler(StepArgs)
    def run(job: Job[StepArgs]) -> None:
        with Session(engine) as session:
            order.append(session.scalar(select(Job.workflow_step).where(Job.id == job.id)) or "")

    ids = insert(engine, diamond()).jobs
    worker.run_until_idle()
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"]
    assert set(job_states(engine).values()) == {JobState.COMPLETED}
    with engine.connect() as connection:
        wf = connection.execute(select(workflow_table)).one()
    assert (wf.total, wf.unfinished, wf.failed) == (4, 0, 0)
    assert wf.finished_at is not None
    assert ids


def test_two_dependencies_completing_at_once_release_exactly_once(engine: Engine) -> None:
    for _ in range(20):
        wf = sa_jobs.Workflow("fan-in")
        b = wf.add(StepArgs(1), name="b")
        c = wf.add(StepArgs(2), name="c")
        wf.add(StepArgs(3), name="d", after=[b, c])
        ids = insert(engine, wf).jobs
        jobs = [fetch_one(engine), fetch_one(engine)]
        barrier = threading.Barrier(2)

        def finish(job: Job[Any], barrier: threading.Barrier) -> None:
            with Session(engine) as session, session.begin():
                barrier.wait()
                sa_jobs.complete_in(session, job)

        threads = [threading.Thread(target=finish, args=(job, barrier)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert get_job(engine, ids["d"]).state is JobState.AVAILABLE
        assert deps_of(engine, ids["d"]) == 0
        complete(engine, fetch_one(engine))


def test_bad_inputs_are_refused_before_anything_is_written(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidWorkflowError, match="no steps"):
            sa_jobs.insert_workflow(session, sa_jobs.Workflow("empty"))
        wf = sa_jobs.Workflow("w")
        wf.add(StepArgs(), name="x")
        with pytest.raises(InvalidWorkflowError, match="already has a step named 'x'"):
            wf.add(StepArgs(), name="x")
        with pytest.raises(InvalidWorkflowError, match="has no step of that name"):
            wf.add(StepArgs(), after=["nope"])
        other = sa_jobs.Workflow("other")
        foreign = other.add(StepArgs())
        with pytest.raises(InvalidWorkflowError, match="belongs to workflow 'other'"):
            wf.add(StepArgs(), after=[foreign])
        with pytest.raises(InvalidWorkflowError, match="after= takes steps"):
            wf.add(StepArgs(), after=[12])  # type: ignore[list-item]
        with pytest.raises(InvalidWorkflowError, match="on_success must be job args"):
            sa_jobs.Workflow("w", on_success="not args")
        with pytest.raises(InvalidWorkflowError, match="cannot take unique="):
            wf.add(StepArgs(), unique=sa_jobs.UniqueOpts(by_args=True))
        # The session is still usable and nothing was written.
        assert session.scalar(select(text("count(*)")).select_from(Job)) == 0


def test_default_step_names(engine: Engine) -> None:
    wf = sa_jobs.Workflow("names")
    steps = [wf.add(StepArgs()), wf.add(Other()), wf.add(StepArgs()), wf.add(StepArgs())]
    assert [s.name for s in steps] == ["wf_step", "wf_other", "wf_step.2", "wf_step.3"]
    inserted = insert(engine, wf)
    assert list(inserted.jobs) == ["wf_step", "wf_other", "wf_step.2", "wf_step.3"]
    assert [s.job_id for s in steps] == sorted(inserted.jobs.values())


# ------------------------------------------------------------------ failures


def fail(engine: Engine, job: Job[Any], *, discard: bool = True) -> None:
    """End a fetched job as discarded (a failure with no attempts left)."""
    with Session(engine) as session, session.begin():
        session.execute(
            text("UPDATE sa_job SET max_attempts = attempt WHERE id = :id"), {"id": job.id}
        )
    finish_outcomes(engine, [Outcome.of(job, Ending.FAILED, error={"error": "boom"})])
    assert get_job(engine, job.id).state is JobState.DISCARDED


def chain_of(n: int, **options: Any) -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow("chain", **options)
    previous: list[sa_jobs.Step] = []
    for i in range(n):
        previous = [wf.add(StepArgs(i), name=f"s{i}", after=previous)]
    return wf


def test_a_failed_step_cancels_its_dependents_recursively_and_a_retry_revives_them(
    engine: Engine,
) -> None:
    ids = insert(engine, chain_of(4)).jobs
    complete(engine, fetch_one(engine))
    s1 = fetch_one(engine)
    fail(engine, s1)
    states = job_states(engine)
    assert [states[ids[f"s{i}"]] for i in range(4)] == [
        JobState.COMPLETED,
        JobState.DISCARDED,
        JobState.CANCELLED,
        JobState.CANCELLED,
    ]
    s3 = get_job(engine, ids["s3"])
    assert s3.metadata_["workflow_cancelled"] == {"because": ids["s1"], "step": "s1"}
    status = status_of(engine, inserted_id(engine))
    assert status.finished and not status.succeeded and status.failed == 3
    assert [(f.name, f.because) for f in status.failed_steps] == [
        ("s1", None),
        ("s2", ids["s1"]),
        ("s3", ids["s1"]),
    ]

    with Session(engine) as session, session.begin():
        sa_jobs.retry_job(session, ids["s1"])
    states = job_states(engine)
    assert states[ids["s1"]] is JobState.AVAILABLE
    assert states[ids["s2"]] is JobState.PENDING and states[ids["s3"]] is JobState.PENDING
    assert "workflow_cancelled" not in get_job(engine, ids["s3"]).metadata_
    assert deps_of(engine, ids["s2"]) == 1 and deps_of(engine, ids["s3"]) == 1
    status = status_of(engine, inserted_id(engine))
    assert (status.unfinished, status.failed) == (3, 0)
    for _ in range(3):
        complete(engine, fetch_one(engine))
    status = status_of(engine, inserted_id(engine))
    assert status.succeeded and (status.unfinished, status.failed) == (0, 0)


def status_of(engine: Engine, workflow_id: int) -> sa_jobs.WorkflowStatus:
    with Session(engine) as session:
        return sa_jobs.workflow_status(session, workflow_id)


def inserted_id(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.max(workflow_table.c.id))) or 0)


def test_a_step_that_runs_anyway_is_released_by_a_failed_dependency(engine: Engine) -> None:
    wf = sa_jobs.Workflow("run-anyway")
    a = wf.add(StepArgs(1), name="a")
    b = wf.add(StepArgs(2), name="b")
    wf.add(StepArgs(3), name="cleanup", after=[a, b], on_dependency_failure="run")
    wf.add(StepArgs(4), name="report", after=[a, b])
    ids = insert(engine, wf).jobs
    fail(engine, fetch_one(engine))
    states = job_states(engine)
    assert states[ids["cleanup"]] is JobState.PENDING  # still waits for b
    assert states[ids["report"]] is JobState.CANCELLED
    complete(engine, fetch_one(engine))
    assert job_states(engine)[ids["cleanup"]] is JobState.AVAILABLE


def test_retrying_a_step_cancelled_by_a_still_failed_dependency_cancels_it_again(
    engine: Engine,
) -> None:
    ids = insert(engine, chain_of(2)).jobs
    fail(engine, fetch_one(engine))
    with Session(engine) as session, session.begin():
        sa_jobs.retry_job(session, ids["s1"])
    assert job_states(engine)[ids["s1"]] is JobState.CANCELLED


def test_retrying_a_pending_step_does_not_start_it_early(engine: Engine) -> None:
    ids = insert(engine, chain_of(2)).jobs
    with Session(engine) as session, session.begin():
        sa_jobs.retry_jobs(session, ids=[ids["s1"]])
    assert job_states(engine)[ids["s1"]] is JobState.PENDING
    assert deps_of(engine, ids["s1"]) == 1


def test_cancel_workflow_cancels_unfinished_steps_and_callbacks(engine: Engine) -> None:
    wf = chain_of(3)
    wf.callbacks["on_complete"] = (Other(9), sa_jobs.InsertOpts())
    inserted = insert(engine, wf)
    running = fetch_one(engine)
    with Session(engine) as session, session.begin():
        changed = sa_jobs.cancel_workflow(session, inserted.id)
    assert changed == 4  # a cancel request for s0, s1, s2, the callback
    states = job_states(engine)
    assert states[inserted.jobs["s1"]] is JobState.CANCELLED
    assert states[inserted.callbacks["on_complete"]] is JobState.CANCELLED
    assert states[running.id] is JobState.RUNNING
    finish_outcomes(engine, [Outcome.of(running, Ending.CANCELLED)])
    status = status_of(engine, inserted.id)
    assert status.finished and status.failed == 3
    assert status.callbacks["on_complete"][1] is JobState.CANCELLED


def test_workflow_status_of_an_unknown_workflow(engine: Engine) -> None:
    with pytest.raises(sa_jobs.errors.WorkflowNotFoundError, match="no workflow with id 12345"):
        status_of(engine, 12345)


def test_workflows_take_an_async_session(engine: Engine) -> None:
    async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
    sessions = async_sessionmaker(async_engine)

    async def scenario() -> tuple[sa_jobs.InsertedWorkflow, sa_jobs.WorkflowStatus, int]:
        async with sessions() as session, session.begin():
            inserted = await sa_jobs.insert_workflow(session, diamond())
        async with sessions() as session, session.begin():
            added = await sa_jobs.add_to_workflow(session, inserted.id, StepArgs(), after=["d"])
        async with sessions() as session:
            status = await sa_jobs.workflow_status(session, inserted.id)
        async with sessions() as session, session.begin():
            cancelled = await sa_jobs.cancel_workflow(session, inserted.id)
        await async_engine.dispose()
        assert added.state is JobState.PENDING
        return inserted, status, cancelled

    inserted, status, cancelled = asyncio.run(scenario())
    assert status.total == 5 and status.counts[JobState.PENDING] == 4
    assert cancelled == 5
    assert set(job_states(engine).values()) == {JobState.CANCELLED}
    assert inserted.jobs["a"] < inserted.jobs["d"]


def test_deleting_an_unfinished_step_cancels_its_dependents(engine: Engine) -> None:
    inserted = insert(engine, chain_of(3))
    with Session(engine) as session, session.begin():
        assert sa_jobs.delete_jobs(session, ids=[inserted.jobs["s0"]]).count == 1
    states = job_states(engine)
    assert states[inserted.jobs["s1"]] is JobState.CANCELLED
    assert states[inserted.jobs["s2"]] is JobState.CANCELLED
    status = status_of(engine, inserted.id)
    assert status.finished and status.failed == 3


def _complete_in_process(url: str, job_id: int, barrier: Any) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with Session(engine) as session, session.begin():
        job = session.get(Job, job_id)
        assert job is not None
        barrier.wait()
        sa_jobs.complete_in(session, job)
    engine.dispose()


def test_two_dependencies_completed_by_two_processes_release_exactly_once(
    engine: Engine,
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    context = process_context()
    for _ in range(5):
        wf = sa_jobs.Workflow("fan-in")
        b = wf.add(StepArgs(1), name="b")
        c = wf.add(StepArgs(2), name="c")
        wf.add(StepArgs(3), name="d", after=[b, c])
        ids = insert(engine, wf).jobs
        jobs = [fetch_one(engine), fetch_one(engine)]
        barrier = context.Barrier(2)
        processes = [
            context.Process(target=_complete_in_process, args=(url, job.id, barrier))
            for job in jobs
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
        assert get_job(engine, ids["d"]).state is JobState.AVAILABLE
        assert deps_of(engine, ids["d"]) == 0
        complete(engine, fetch_one(engine))


def test_the_completer_writes_completed_steps_and_all_they_release_as_one_statement(
    engine: Engine,
) -> None:
    # The worker's completer writes a batch of completed steps as ONE statement sent in
    # autocommit mode (psycopg sends no BEGIN and no COMMIT): the completion, the release
    # of the dependents, the workflow's counters and, when the workflow finishes, its
    # callbacks. One statement is its own transaction, so a kill -9 cannot split it: it is
    # atomic by construction (what tests/acceptance/test_workflow_kill9.py saw when these
    # were separate autocommitted statements cannot happen).
    from sqlalchemy import event

    from sa_jobs._table.schema import Features
    from sa_jobs.worker.completer import write_outcomes

    wf = sa_jobs.Workflow("one statement", on_complete=Other(0), on_failure=Other(1))
    a = wf.add(StepArgs(1), name="a")
    wf.add(StepArgs(2), name="b", after=[a])
    inserted = insert(engine, wf)
    ids, callbacks = inserted.jobs, inserted.callbacks
    with engine.connect() as connection:
        features = Features.of(connection)
    sent: list[tuple[str, bool]] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append((statement, conn.connection.driver_connection.autocommit))

    def unexpected(conn: Any) -> None:
        sent.append(("COMMIT", False))

    event.listen(engine, "before_cursor_execute", count)
    event.listen(engine, "commit", unexpected)
    try:
        for name, left in (("a", 1), ("b", 0)):
            step = fetch_one(engine)
            assert step.id == ids[name]
            sent.clear()
            assert write_outcomes(engine, [Outcome.of(step, Ending.COMPLETED)], features) == 1
            assert len(sent) == 1, [statement for statement, _ in sent]
            assert sent[0][1] is True  # autocommit: no BEGIN/COMMIT round trips around it
            with engine.connect() as connection:
                assert connection.scalar(select(workflow_table.c.unfinished)) == left
    finally:
        event.remove(engine, "before_cursor_execute", count)
        event.remove(engine, "commit", unexpected)
    states = job_states(engine)
    assert states[ids["a"]] is JobState.COMPLETED
    assert states[ids["b"]] is JobState.COMPLETED
    assert states[callbacks["on_complete"]] is JobState.AVAILABLE
    assert states[callbacks["on_failure"]] is JobState.CANCELLED
    assert get_job(engine, callbacks["on_complete"]).metadata_["workflow"] == {
        "id": inserted.id,
        "name": "one statement",
        "total": 2,
        "completed": 2,
        "failed": 0,
    }


def test_a_failed_step_is_written_with_its_cascade_in_one_transaction(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch in which a step may fail cannot be one statement: the cascade to its
    # dependents runs after the finish, in the same transaction. Make the counters'
    # statement, the last of them, fail: nothing of the outcome may stay (in autocommit
    # mode the step would stay discarded with its dependents cancelled and the counter
    # never moved).
    from sa_jobs._act import workflow_release
    from sa_jobs._table.schema import Features
    from sa_jobs.worker.completer import write_outcomes

    wf = sa_jobs.Workflow("atomic")
    a = wf.add(StepArgs(1), name="a")
    wf.add(StepArgs(2), name="b", after=[a])
    ids = insert(engine, wf).jobs
    step = fetch_one(engine)
    outcome = Outcome.of(step, Ending.DISCARDED, error={"error": "boom"})
    assert outcome.in_workflow is True  # the fetch loaded the step's workflow_id

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the process died here")

    monkeypatch.setattr(workflow_release, "adjust_counters", crash)
    with engine.connect() as connection:
        features = Features.of(connection)
    with pytest.raises(RuntimeError, match="died"):
        write_outcomes(engine, [outcome], features)
    states = job_states(engine)
    assert states[ids["a"]] is JobState.RUNNING
    assert states[ids["b"]] is JobState.PENDING

    monkeypatch.undo()
    assert write_outcomes(engine, [outcome], features) == 1
    states = job_states(engine)
    assert states[ids["a"]] is JobState.DISCARDED
    assert states[ids["b"]] is JobState.CANCELLED
    with engine.connect() as connection:
        row = connection.execute(select(workflow_table.c.unfinished, workflow_table.c.failed))
        assert tuple(row.one()) == (0, 2)


def test_a_step_added_while_its_dependency_s_completion_waits_is_released(
    engine: Engine,
) -> None:
    # The completion of a batch of steps is one statement, reading under the snapshot it
    # took when it began. Here it begins while add_to_workflow holds the running step's
    # row lock, and waits; the add then commits a new edge out of the step, which that
    # snapshot does not hold. The step must still release the new step: the add gives
    # the step a new row version, the statement leaves a row it did not see as it is, and
    # the writer finishes it in a transaction (without either, the new step stays
    # pending for good).
    from sa_jobs._table.schema import Features
    from sa_jobs.worker.completer import write_outcomes

    wf = sa_jobs.Workflow("late edge")
    a = wf.add(StepArgs(1), name="a")
    wf.add(StepArgs(2), name="b", after=[a])
    inserted = insert(engine, wf)
    ids = inserted.jobs
    step = fetch_one(engine)
    assert step.id == ids["a"]
    with engine.connect() as connection:
        features = Features.of(connection)
    written: list[int] = []
    completion = threading.Thread(
        target=lambda: written.append(
            write_outcomes(engine, [Outcome.of(step, Ending.COMPLETED)], features)
        )
    )
    with Session(engine) as session, session.begin():
        added = sa_jobs.add_to_workflow(session, inserted.id, StepArgs(3), after=[ids["a"]])
        assert added.state is JobState.PENDING
        completion.start()
        wait_until(lambda: sessions_waiting_for_a_lock(engine), timeout=10)
    completion.join(10)
    assert written == [1]
    states = job_states(engine)
    assert states[ids["a"]] is JobState.COMPLETED
    assert states[ids["b"]] is JobState.AVAILABLE
    assert states[added.job_id] is JobState.AVAILABLE
    assert deps_of(engine, added.job_id) == 0
    with engine.connect() as connection:
        assert connection.scalar(select(workflow_table.c.unfinished)) == 2
