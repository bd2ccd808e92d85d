"""``job.output_of(step)`` in a dependent's (and a callback's) handler, and
``add_to_workflow``: steps added to a workflow in the database."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import attrs
import pytest
from sqlalchemy import URL, Engine, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._table.workflow_tables import dep_table
from sa_jobs.errors import InvalidWorkflowError, JobStateError, UnknownStepError
from tests.helpers import fetch_one, job_states, make_worker, url_text
from tests.helpers import insert_workflow as insert


@attrs.frozen
class Thumbnail:
    url: str
    width: int


@sa_jobs.job_args(kind="wfo_resize", output=Thumbnail)
class Resize:
    width: int = 0


@sa_jobs.job_args(kind="wfo_publish")
class Publish:
    steps: list[str] = attrs.field(factory=list)


@sa_jobs.job_args(kind="wfo_summary")
class Summary:
    pass


def test_a_dependent_reads_its_dependencies_outputs_by_step_name(engine: Engine) -> None:
    seen: dict[str, Any] = {}
    worker = make_worker(engine)

    @worker.handler(Resize)
    def resize(job: Job[Resize]) -> Thumbnail:
        return Thumbnail(f"/t/{job.args.width}.png", job.args.width)

    @worker.handler(Publish)
    def publish(job: Job[Publish]) -> None:
        for step in job.args.steps:
            seen[step] = job.output_of(step)
        with pytest.raises(UnknownStepError, match="has no step named 'nope'"):
            job.output_of("nope")

    @worker.handler(Summary)
    def summary(job: Job[Summary]) -> None:
        seen["callback"] = job.output_of("avatar")

    wf = sa_jobs.Workflow("thumbs", on_complete=Summary())
    avatar = wf.add(Resize(64), name="avatar")
    banner = wf.add(Resize(800), name="banner")
    wf.add(Publish(["avatar", "banner"]), after=[avatar, banner])
    insert(engine, wf)
    worker.run_until_idle()
    assert seen == {
        "avatar": Thumbnail("/t/64.png", 64),
        "banner": Thumbnail("/t/800.png", 800),
        "callback": Thumbnail("/t/64.png", 64),
    }


def test_output_of_a_step_that_did_not_complete_is_refused(engine: Engine) -> None:
    errors: list[BaseException] = []
    worker = make_worker(engine)

    @worker.handler(Resize)
    def resize(job: Job[Resize]) -> Thumbnail:
        raise sa_jobs.errors.JobCancel("no")

    @worker.handler(Publish)
    def publish(job: Job[Publish]) -> None:
        try:
            job.output_of("avatar")
        except JobStateError as exc:
            errors.append(exc)

    wf = sa_jobs.Workflow("thumbs")
    avatar = wf.add(Resize(64), name="avatar")
    wf.add(Publish(), after=[avatar], on_dependency_failure="run")
    insert(engine, wf)
    worker.run_until_idle()
    assert len(errors) == 1 and "'cancelled'" in str(errors[0])


def test_output_of_outside_a_worker_says_so() -> None:
    job: Job[Any] = Job(id=1, kind="wfo_publish")
    with pytest.raises(JobStateError, match="not being run by a worker"):
        job.output_of("avatar")


def test_add_to_workflow_waits_for_unfinished_steps_and_not_for_completed_ones(
    engine: Engine,
) -> None:
    wf = sa_jobs.Workflow("grow")
    first = wf.add(Resize(1), name="first")
    wf.add(Resize(2), name="second", after=[first])
    inserted = insert(engine, wf)
    job = fetch_one(engine)
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job, output=Thumbnail("/1", 1))
    with Session(engine) as session, session.begin():
        after_first = sa_jobs.add_to_workflow(session, inserted.id, Publish(), after=["first"])
        after_both = sa_jobs.add_to_workflow(
            session, inserted.id, Publish(), after=[inserted.jobs["first"], "second"]
        )
    assert after_first.state is JobState.AVAILABLE and after_first.name == "wfo_publish"
    assert after_both.state is JobState.PENDING and after_both.name == "wfo_publish.4"
    second = fetch_one(engine)
    assert second.id == inserted.jobs["second"]
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, second, output=Thumbnail("/2", 2))
    assert job_states(engine)[after_both.job_id] is JobState.AVAILABLE
    with Session(engine) as session:
        status = sa_jobs.workflow_status(session, inserted.id)
    assert (status.total, status.unfinished) == (4, 2)


def test_add_to_workflow_after_a_failed_step_is_cancelled_unless_it_runs_anyway(
    engine: Engine,
) -> None:
    inserted = insert(engine, sa_jobs.chain(Resize(1), name="c"))
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_job(session, inserted.jobs["wfo_resize"])
        doomed = sa_jobs.add_to_workflow(session, inserted.id, Publish(), after=["wfo_resize"])
        anyway = sa_jobs.add_to_workflow(
            session, inserted.id, Summary(), after=["wfo_resize"], on_dependency_failure="run"
        )
    assert doomed.state is JobState.CANCELLED and anyway.state is JobState.AVAILABLE
    with Session(engine) as session:
        cancelled = session.get(Job, doomed.job_id)
        assert cancelled is not None
        assert cancelled.metadata_["workflow_cancelled"]["step"] == "wfo_resize"
        status = sa_jobs.workflow_status(session, inserted.id)
    assert (status.total, status.unfinished, status.failed) == (3, 1, 2)


def test_a_step_added_after_finished_steps_records_its_edges_resolved(engine: Engine) -> None:
    # The edges of an added step are written as its dependencies stand: resolved for a
    # completed one (and a failed one it runs despite). Written unresolved, a retry of the
    # step would count them and leave it pending for good behind a finished dependency.
    wf = sa_jobs.Workflow("grow, then retry")
    wf.add(Resize(1), name="first")
    wf.add(Resize(2), name="other")
    inserted = insert(engine, wf)
    first = fetch_one(engine)
    assert first.id == inserted.jobs["first"]
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, first, output=Thumbnail("/1", 1))
        sa_jobs.cancel_job(session, inserted.jobs["other"])
    with Session(engine) as session, session.begin():
        added = sa_jobs.add_to_workflow(
            session, inserted.id, Summary(), after=["first", "other"], on_dependency_failure="run"
        )
    assert added.state is JobState.AVAILABLE
    with engine.connect() as connection:
        edges = connection.execute(
            select(dep_table.c.depends_on_id, dep_table.c.resolved)
            .where(dep_table.c.job_id == added.job_id)
            .order_by(dep_table.c.depends_on_id)
        ).all()
    assert [tuple(edge) for edge in edges] == [
        (inserted.jobs["first"], True),
        (inserted.jobs["other"], True),
    ]
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_job(session, added.job_id)
    with Session(engine) as session, session.begin():
        assert sa_jobs.retry_job(session, added.job_id)
    assert job_states(engine)[added.job_id] is JobState.AVAILABLE


def test_add_to_workflow_bad_input_writes_nothing(engine: Engine) -> None:
    inserted = insert(engine, sa_jobs.chain(Resize(1), name="c"))
    other = insert(engine, sa_jobs.chain(Resize(1), name="other"))
    with Session(engine) as session:
        with pytest.raises(InvalidWorkflowError, match="is not a step of workflow"):
            sa_jobs.add_to_workflow(
                session, inserted.id, Publish(), after=[other.jobs["wfo_resize"]]
            )
        with pytest.raises(InvalidWorkflowError, match="no step of that name"):
            sa_jobs.add_to_workflow(session, inserted.id, Publish(), after=["nope"])
        with pytest.raises(InvalidWorkflowError, match="already has a step named"):
            sa_jobs.add_to_workflow(session, inserted.id, Publish(), name="wfo_resize")
        with pytest.raises(sa_jobs.errors.WorkflowNotFoundError):
            sa_jobs.add_to_workflow(session, 999, Publish())
        assert session.scalar(select(Job.id).where(Job.kind == "wfo_publish")) is None


@sa_jobs.job_args(kind="wfo_count", output=int)
class Count:
    n: int = 0


@sa_jobs.job_args(kind="wfo_tick")
class Tick:
    pass


@pytest.mark.parametrize("given", ["Engine", "AsyncEngine"])
def test_async_forms_keep_the_event_loop_running_while_they_wait(
    engine: Engine, database_url: URL, given: str
) -> None:
    """An async step reads its dependency's output and records its own with the async
    forms while sa_job is locked: their statements wait, and another async handler on the
    same loop keeps running meanwhile (the sync forms would hold the loop for the wait).
    Given an Engine, the forms run in a thread; given an AsyncEngine (checked to reach
    this database), on the loop's async engine."""
    started, proceed, ticking, stop = (threading.Event() for _ in range(4))
    ticks: list[float] = []
    seen: list[int] = []
    async_engine = create_async_engine(url_text(database_url))
    worker_engine: Any = async_engine if given == "AsyncEngine" else engine
    worker = make_worker(worker_engine, queues={"default": 4})

    @worker.handler(Count)
    async def count(job: Job[Count]) -> int | None:
        if job.args.n == 1:
            return 1
        started.set()
        await asyncio.to_thread(proceed.wait, 10)
        first = await job.output_of_async("first")
        seen.append(first)
        await job.record_output_async(first + 1)
        seen.append(first + 1)
        return None  # keeps the recorded output

    @worker.handler(Tick)
    async def tick(job: Job[Tick]) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            ticking.set()
            await asyncio.sleep(0.01)

    wf = sa_jobs.Workflow("async outputs")
    first = wf.add(Count(1), name="first")
    wf.add(Count(2), name="second", after=[first])
    inserted = insert(engine, wf)
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Tick())
    worker.start()
    try:
        assert started.wait(10) and ticking.wait(10)
        with engine.begin() as connection:
            connection.exec_driver_sql("LOCK TABLE sa_job IN ACCESS EXCLUSIVE MODE")
            proceed.set()
            locked_at = time.monotonic()
            time.sleep(1.0)
            during = [t for t in ticks if t > locked_at]
            assert not seen  # the read waits for the lock...
        # ...and the loop ticked all along: no pause near the second the lock was held.
        gaps = [b - a for a, b in zip([locked_at, *during], during, strict=False)]
        assert len(during) > 20 and max(gaps) < 0.5, max(gaps, default=None)
        deadline = time.monotonic() + 10
        while job_states(engine)[inserted["second"]] is not JobState.COMPLETED:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        stop.set()
        worker.stop(cancel=True)
        asyncio.run(async_engine.dispose())
    assert seen == [1, 2]
    with Session(engine) as session:
        assert session.get_one(Job, inserted["second"]).output == 2
