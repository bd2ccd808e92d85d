"""Hooks around inserts and around work (sa_jobs.hooks), against the real database and a
real worker: their order, what they see for every way an attempt ends, metadata an
insert hook adds landing in the row on every insert path, and hooks that raise."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertAction, Job, JobState
from sa_jobs.errors import InvalidOptionsError, JobCancel, JobSnooze, SchemaMissingError
from sa_jobs.hooks import (
    INSERT_HOOKS,
    AttemptResult,
    Ending,
    InsertHook,
    InsertingJob,
    WorkHook,
    add_insert_hook,
    remove_insert_hook,
)
from tests.doc_recipes import load_recipe
from tests.helpers import NO_DELAY, add_job, get_job, make_worker, running, wait_event


@sa_jobs.job_args(kind="hooks_task", max_attempts=3)
class Task:
    how: str = "return"


@sa_jobs.job_args(kind="hooks_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class UniqueTask:
    n: int = 0


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def _no_insert_hooks() -> Iterator[None]:
    INSERT_HOOKS.active = ()
    yield
    INSERT_HOOKS.active = ()


class Recorder(WorkHook):
    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.calls = calls

    def before_work(self, job: Job[Any]) -> None:
        self.calls.append((self.name, "before", job.id))

    def after_work(self, job: Job[Any], result: AttemptResult) -> None:
        self.calls.append((self.name, "after", job.id, result))


def _handle(job: Job[Task]) -> None:
    how = job.args.how
    if how == "raise":
        raise Boom("no")
    if how == "cancel":
        raise JobCancel("not wanted")
    if how == "snooze":
        raise JobSnooze(30)


async def _handle_async(job: Job[Task]) -> None:
    await asyncio.sleep(0)
    _handle(job)


# ------------------------------------------------------------------ work hooks


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_work_hooks_run_in_order_around_each_attempt(engine: Engine, kind: str) -> None:
    job_id = add_job(engine, Task())
    calls: list[tuple[Any, ...]] = []
    worker = make_worker(engine, hooks=[Recorder("first", calls)])
    worker.add_hook(Recorder("second", calls))
    worker.handler(Task)(_handle if kind == "sync" else _handle_async)

    worker.run_until_idle()

    assert [call[:3] for call in calls] == [
        ("first", "before", job_id),
        ("second", "before", job_id),
        ("second", "after", job_id),
        ("first", "after", job_id),
    ]
    result = calls[2][3]
    assert result.ending is Ending.COMPLETED and result.outcome == "completed"
    assert result.exception is None and result.duration >= 0


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    ("how", "attempts", "ending", "outcome"),
    [
        ("return", 3, Ending.COMPLETED, "completed"),
        ("raise", 3, Ending.FAILED, "failed"),
        ("raise", 1, Ending.FAILED, "discarded"),
        ("cancel", 3, Ending.CANCELLED, "cancelled"),
        ("snooze", 3, Ending.SNOOZED, "snoozed"),
    ],
)
def test_after_work_sees_how_the_attempt_ended(
    engine: Engine, kind: str, how: str, attempts: int, ending: Ending, outcome: str
) -> None:
    job_id = add_job(engine, Task(how=how), max_attempts=attempts)
    calls: list[tuple[Any, ...]] = []
    worker = make_worker(engine, hooks=[Recorder("only", calls)], retry_policy=NO_DELAY)
    worker.handler(Task)(_handle if kind == "sync" else _handle_async)

    with running(worker):
        final = {"completed": JobState.COMPLETED, "discarded": JobState.DISCARDED}
        state = final.get(outcome)
        _wait_for(lambda: any(call[1] == "after" for call in calls))
        if state is not None:
            _wait_for(lambda: get_job(engine, job_id).state is state)

    after = next(call for call in calls if call[1] == "after")
    assert after[2] == job_id
    result: AttemptResult = after[3]
    assert (result.ending, result.outcome) == (ending, outcome)
    if how == "raise":
        assert isinstance(result.exception, Boom)
        assert result.error == "Boom: no"
    elif how == "cancel":
        assert isinstance(result.exception, JobCancel)
    elif how == "snooze":
        assert result.delay == 30
    else:
        assert result.exception is None and result.error is None


def test_after_work_of_a_handler_that_completes_in_its_session(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    calls: list[tuple[Any, ...]] = []
    worker = make_worker(engine, hooks=[Recorder("only", calls)])

    @worker.handler(Task)
    def handle(job: Job[Task], session: Session) -> None:
        pass

    worker.run_until_idle()

    assert [call[:3] for call in calls] == [("only", "before", job_id), ("only", "after", job_id)]
    assert calls[1][3].ending is Ending.COMPLETED
    assert get_job(engine, job_id).state is JobState.COMPLETED


def test_after_work_of_a_timed_out_attempt(engine: Engine) -> None:
    job_id = add_job(engine, Task(how="sleep"))
    calls: list[tuple[Any, ...]] = []
    worker = make_worker(engine, hooks=[Recorder("only", calls)], retry_policy=NO_DELAY)

    @worker.handler(Task, timeout=0.05)
    async def handle(job: Job[Task]) -> None:
        await asyncio.sleep(5)

    with running(worker):
        _wait_for(lambda: any(call[1] == "after" for call in calls))

    result: AttemptResult = calls[1][3]
    assert calls[1][2] == job_id
    assert result.ending is Ending.FAILED
    assert result.error is not None and "timeout" in result.error


def test_after_work_of_an_attempt_given_back_by_a_shutdown(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    calls: list[tuple[Any, ...]] = []
    started = threading.Event()
    worker = make_worker(engine, hooks=[Recorder("only", calls)])

    @worker.handler(Task)
    async def handle(job: Job[Task]) -> None:
        started.set()
        await asyncio.sleep(10)

    worker.start()
    try:
        wait_event(started, "the handler to start")
    finally:
        worker.stop(cancel=True)

    assert [call[:3] for call in calls] == [("only", "before", job_id), ("only", "after", job_id)]
    result: AttemptResult = calls[1][3]
    assert (result.ending, result.outcome) == (Ending.RETURNED, "returned")
    assert get_job(engine, job_id).state is JobState.AVAILABLE


def test_a_work_hook_that_raises_is_logged_and_the_job_still_completes(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = add_job(engine, Task())
    calls: list[tuple[Any, ...]] = []

    class Broken(WorkHook):
        def before_work(self, job: Job[Any]) -> None:
            raise RuntimeError("broken before")

        def after_work(self, job: Job[Any], result: AttemptResult) -> None:
            raise RuntimeError("broken after")

    worker = make_worker(engine, hooks=[Broken(), Recorder("fine", calls)])
    worker.handler(Task)(_handle)

    with caplog.at_level(logging.ERROR, logger="sa_jobs.hooks"):
        worker.run_until_idle()

    assert get_job(engine, job_id).state is JobState.COMPLETED
    assert [call[1] for call in calls] == ["before", "after"]
    messages = [record.getMessage() for record in caplog.records]
    assert "Broken.before_work raised; ignored" in messages
    assert "Broken.after_work raised; ignored" in messages


def test_a_work_hook_must_have_both_methods(engine: Engine) -> None:
    class Half:
        def before_work(self, job: Job[Any]) -> None:
            pass

    with pytest.raises(InvalidOptionsError, match="after_work"):
        make_worker(engine, hooks=[Half()])  # type: ignore[list-item]
    worker = make_worker(engine)
    worker.handler(Task)(_handle)
    with running(worker), pytest.raises(InvalidOptionsError, match="while the worker runs"):
        worker.add_hook(Recorder("late", []))


# ------------------------------------------------------------------ insert hooks


class Stamp(InsertHook):
    """Adds its name to each job's metadata and records what it saw."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.calls = calls

    def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
        self.calls.append((self.name, "before", [job.kind for job in jobs]))
        for job in jobs:
            job.metadata.setdefault("stamps", []).append(self.name)

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        self.calls.append((self.name, "after", [(job.id, job.action) for job in jobs], error))


def test_insert_hooks_run_in_order_and_their_metadata_lands_in_the_row(engine: Engine) -> None:
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("first", calls))
    add_insert_hook(Stamp("second", calls))

    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.insert(session, Task(), metadata={"mine": 1}).job

    assert [call[:2] for call in calls] == [
        ("first", "before"),
        ("second", "before"),
        ("second", "after"),
        ("first", "after"),
    ]
    assert calls[2][2] == [(job.id, InsertAction.INSERTED)] and calls[2][3] is None
    assert get_job(engine, job.id).metadata_ == {"mine": 1, "stamps": ["first", "second"]}


def test_insert_hooks_on_every_insert_path(engine: Engine, database_url: URL) -> None:
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("stamp", calls))
    shared = {"shared": True}

    with Session(engine, expire_on_commit=False) as session, session.begin():
        added = sa_jobs.enqueue(Task(), metadata=shared)
        session.add(added)
        session.flush()
        assert added.metadata_ == {"shared": True, "stamps": ["stamp"]}
        many = sa_jobs.insert_many(session, [Task(), Task()], metadata=shared)

    async def with_async_session() -> list[int]:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                result = await sa_jobs.insert(session, Task())
                job = sa_jobs.enqueue(Task())
                session.add(job)
                await session.flush()
                return [result.job.id, job.id]
        finally:
            await async_engine.dispose()

    async_ids = asyncio.run(with_async_session())

    ids = [added.id, *(result.job.id for result in many), *async_ids]
    for job_id in ids:
        assert get_job(engine, job_id).metadata_["stamps"] == ["stamp"]
    # The caller's metadata dict is never changed by a hook.
    assert shared == {"shared": True}
    # One before/after pair per insert call or flush: 1 + 1 + 2.
    assert [call[1] for call in calls].count("before") == 4
    after_many = [call for call in calls if call[1] == "after"][1]
    assert after_many[2] == [(r.job.id, InsertAction.INSERTED) for r in many]


def test_after_insert_sees_skipped_duplicates(engine: Engine) -> None:
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("stamp", calls))

    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, UniqueTask(n=1)).job
        sa_jobs.insert(session, UniqueTask(n=1))

    assert calls[-1][2] == [(first.id, InsertAction.SKIPPED_DUPLICATE)]


def test_after_insert_sees_a_failed_insert(core_only: Engine) -> None:
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("stamp", calls))

    with Session(core_only) as session, pytest.raises(SchemaMissingError):
        sa_jobs.insert(session, UniqueTask(n=1))  # no unique branch in this database

    assert calls[-1][:2] == ("stamp", "after")
    assert calls[-1][2] == [(None, None)]
    assert isinstance(calls[-1][3], SchemaMissingError)


def test_an_insert_hook_that_raises_or_breaks_metadata_loses_no_job(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    class Raises(InsertHook):
        def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
            raise RuntimeError("broken")

        def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
            raise RuntimeError("broken")

    class Unstorable(InsertHook):
        def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
            for job in jobs:
                job.metadata["bad"] = object()

    add_insert_hook(Raises())
    add_insert_hook(Unstorable())

    with (
        caplog.at_level(logging.ERROR, logger="sa_jobs.hooks"),
        Session(engine, expire_on_commit=False) as session,
        session.begin(),
    ):
        job = sa_jobs.insert(session, Task(), metadata={"mine": 1}).job

    assert get_job(engine, job.id).metadata_ == {"mine": 1}
    messages = " | ".join(record.getMessage() for record in caplog.records)
    assert "Raises.before_insert raised; ignored" in messages
    assert "Raises.after_insert raised; ignored" in messages
    assert "unstorable metadata" in messages


def test_insert_hooks_are_added_once_and_removed(engine: Engine) -> None:
    calls: list[tuple[Any, ...]] = []
    stamp = Stamp("stamp", calls)
    add_insert_hook(stamp)
    add_insert_hook(stamp)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.insert(session, Task()).job
    remove_insert_hook(stamp)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        other = sa_jobs.insert(session, Task()).job

    assert get_job(engine, job.id).metadata_ == {"stamps": ["stamp"]}
    assert get_job(engine, other.id).metadata_ == {}
    with pytest.raises(InvalidOptionsError, match="before_insert"):
        add_insert_hook(object())  # type: ignore[arg-type]


def _wait_for(predicate: Any, timeout: float = 5.0) -> None:
    from tests.helpers import eventually

    assert eventually(predicate, timeout), "timed out"


def test_the_recipe_in_the_docs(engine: Engine) -> None:
    recipe = load_recipe("observability.md", "Hooks")
    add_insert_hook(recipe.TenantStamp())
    token = recipe.current_tenant.set("acme")
    try:
        job_id = add_job(engine, Task())
    finally:
        recipe.current_tenant.reset(token)
    slow = recipe.SlowAttempts(limit=0.0)
    worker = make_worker(engine, hooks=[slow])
    worker.handler(Task)(_handle)

    worker.run_until_idle()

    assert get_job(engine, job_id).metadata_ == {"tenant": "acme"}
    assert [(entry[0], entry[1]) for entry in slow.slow] == [(job_id, "completed")]


def test_insert_hooks_see_every_step_and_callback_of_a_workflow(engine: Engine) -> None:
    """A workflow's steps and callbacks, the Celery shorthands' and add_to_workflow's are
    inserts like any other: a hook that stamps or counts inserts sees every one."""
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("stamp", calls))
    wf = sa_jobs.Workflow("hooked", on_success=Task(how="success"))
    first = wf.add(Task(), name="first")
    wf.add(Task(), name="second", after=[first])
    batch = sa_jobs.Batch(on_complete=Task(how="done"))
    batch.add_many([Task(), Task()])
    shapes = [
        wf,
        batch,
        sa_jobs.chain(Task(), Task()),
        sa_jobs.group(Task(), Task()),
        sa_jobs.chord([Task(), Task()], Task()),
    ]

    with Session(engine, expire_on_commit=False) as session, session.begin():
        inserted = [sa_jobs.insert_workflow(session, shape) for shape in shapes]
        added = sa_jobs.add_to_workflow(session, inserted[0].id, Task(), after=["second"])

    expected = [[*one.jobs.values(), *one.callbacks.values()] for one in inserted] + [
        [added.job_id]
    ]
    afters = [call for call in calls if call[1] == "after"]
    # One before/after pair per call, in which every job written is seen, with its id.
    assert [call[1] for call in calls] == ["before", "after"] * len(expected)
    assert [[job_id for job_id, _ in call[2]] for call in afters] == expected
    assert all(action is InsertAction.INSERTED for call in afters for _, action in call[2])
    assert all(call[3] is None for call in afters)
    with Session(engine) as session:
        for job_id in (job_id for ids in expected for job_id in ids):
            metadata = session.get_one(Job, job_id).metadata_
            assert metadata["stamps"] == ["stamp"]
    # A callback's own bookkeeping survives the hook's metadata.
    callback = get_job(engine, inserted[0].callbacks["on_success"])
    assert callback.metadata_["stamps"] == ["stamp"] and len(callback.metadata_) == 2


def test_insert_hooks_see_a_workflow_insert_that_failed(core_only: Engine) -> None:
    calls: list[tuple[Any, ...]] = []
    add_insert_hook(Stamp("stamp", calls))

    with Session(core_only) as session, pytest.raises(SchemaMissingError):
        sa_jobs.insert_workflow(session, sa_jobs.chain(Task(), Task()))

    assert calls[-1][:2] == ("stamp", "after")
    assert calls[-1][2] == [(None, None), (None, None)]
    assert isinstance(calls[-1][3], SchemaMissingError)
