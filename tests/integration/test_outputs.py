"""Recorded outputs: a handler's return value is stored with its job's completion, in the
same statement (or, for ``complete_in(output=...)``, the caller's transaction), typed by
the kind's ``output=`` and refused — failing that attempt — when it cannot be stored."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any

import pytest
from sqlalchemy import URL, Engine, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.errors import (
    InvalidJobArgsError,
    InvalidOutputError,
    JobStateError,
    SchemaMissingError,
)
from sa_jobs.testing import run_jobs
from tests.helpers import (
    add_job,
    effects,
    fetch_one,
    finish_statements,
    get_job,
    make_worker,
    wait_for_state,
    write_effect,
)


@sa_jobs.job_args(kind="output_thumbnail_value")
class Thumbnail:
    url: str
    width: int


@sa_jobs.job_args(kind="output_resize", output=Thumbnail, max_attempts=2)
class Resize:
    image_id: int


@sa_jobs.job_args(kind="output_untyped", max_attempts=2)
class Untyped:
    n: int = 0


@dataclasses.dataclass(frozen=True)
class Totals:
    count: int
    names: list[str]


@sa_jobs.job_args(kind="output_async", output=Totals)
class AsyncTask:
    n: int = 0


@sa_jobs.job_args(kind="output_listed", output=list[int])
class Listed:
    n: int = 0


@sa_jobs.job_args(kind="output_capped", max_output_bytes=64, max_attempts=1)
class Capped:
    size: int = 0


def stored_output(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.scalar(select(Job.output_json).where(Job.id == job_id))


def loaded(engine: Engine, job_id: int) -> Job[Any]:
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        assert job is not None
        _ = job.output_json  # load the deferred column before the session closes
        return job


# ------------------------------------------------------------------ handlers' return values


def test_a_sync_handlers_return_value_is_stored_and_read_back_typed(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(Resize)
    def resize(job: Job[Resize]) -> Thumbnail:
        return Thumbnail(url=f"/t/{job.args.image_id}.png", width=64)

    job_id = add_job(engine, Resize(7))
    assert worker.run_until_idle().worked == 1

    assert stored_output(engine, job_id) == {"url": "/t/7.png", "width": 64}
    job = loaded(engine, job_id)
    assert job.state is JobState.COMPLETED
    assert job.output == Thumbnail(url="/t/7.png", width=64)


def test_an_async_handlers_return_value_is_stored(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(AsyncTask)
    async def count(job: Job[AsyncTask]) -> Totals:
        return Totals(count=job.args.n, names=["a", "b"])

    job_id = add_job(engine, AsyncTask(3))
    assert worker.run_until_idle().worked == 1
    assert loaded(engine, job_id).output == Totals(count=3, names=["a", "b"])


def test_an_async_session_handlers_return_value_commits_with_its_work(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(AsyncTask)
    async def count(job: Job[AsyncTask], session: AsyncSession) -> Totals:
        return Totals(count=5, names=[])

    job_id = add_job(engine, AsyncTask(5))
    assert worker.run_until_idle().worked == 1
    assert loaded(engine, job_id).output == Totals(count=5, names=[])


@pytest.mark.usefixtures("effect_table")
def test_a_session_handlers_return_value_commits_with_its_work(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(Untyped)
    def work(job: Job[Untyped], session: Session) -> dict[str, Any]:
        write_effect(session, job, "done")
        return {"rows": 3, "ok": True}

    job_id = add_job(engine, Untyped())
    assert worker.run_until_idle().worked == 1
    assert stored_output(engine, job_id) == {"rows": 3, "ok": True}
    assert effects(engine) == [(job_id, 1, "done")]


def test_untyped_outputs_are_any_json_value(engine: Engine) -> None:
    values: list[Any] = ["text", 12, 1.5, [1, "two", None], {"nested": {"a": [True]}}, False]
    worker = make_worker(engine)

    @worker.handler(Untyped)
    def work(job: Job[Untyped]) -> Any:
        return values[job.args.n]

    ids = [add_job(engine, Untyped(n)) for n in range(len(values))]
    worker.run_until_idle()
    assert [stored_output(engine, job_id) for job_id in ids] == values


def test_a_generic_output_type_round_trips(engine: Engine) -> None:
    worker = make_worker(engine)
    worker.handler(Listed)(lambda job: [1, 2, 3])
    job_id = add_job(engine, Listed())
    worker.run_until_idle()
    assert loaded(engine, job_id).output == [1, 2, 3]


def test_returning_none_stores_nothing_and_keeps_the_plain_completion_statement(
    engine: Engine,
) -> None:
    worker = make_worker(engine, completer="inline")
    worker.handler(Untyped)(lambda job: None)
    job_id = add_job(engine, Untyped())
    with finish_statements(engine) as sent:
        worker.run_until_idle()
    assert get_job(engine, job_id).state is JobState.COMPLETED
    assert stored_output(engine, job_id) is None
    assert sent and all("output" not in statement for statement in sent)
    assert all("unnest" in statement for statement in sent)  # the arrays form, as before


def test_a_batch_mixing_outputs_and_plain_completions_writes_each(engine: Engine) -> None:
    worker = make_worker(engine)
    worker.handler(Untyped)(lambda job: {"n": job.args.n} if job.args.n % 2 else None)
    ids = [add_job(engine, Untyped(n)) for n in range(10)]
    worker.run_until_idle()
    assert [stored_output(engine, job_id) for job_id in ids] == [
        {"n": n} if n % 2 else None for n in range(10)
    ]
    assert all(get_job(engine, job_id).state is JobState.COMPLETED for job_id in ids)


# ------------------------------------------------------------------ outputs that cannot be stored


def test_an_output_that_is_not_json_fails_the_attempt_with_a_clear_error(engine: Engine) -> None:
    worker = make_worker(engine)
    worker.handler(Untyped)(lambda job: {"when": object()})
    job_id = add_job(engine, Untyped(), max_attempts=1)
    worker.run_until_idle()
    job = wait_for_state(engine, job_id, JobState.DISCARDED)
    error = job.errors[-1]["error"]
    assert "InvalidOutputError" in error
    assert "output_untyped" in error and "['when']" in error
    assert stored_output(engine, job_id) is None


def test_an_output_of_the_wrong_type_fails_the_attempt_and_is_retried(engine: Engine) -> None:
    worker = make_worker(engine, retry_policy=_NoDelay())
    calls: list[int] = []

    @worker.handler(Resize)
    def resize(job: Job[Resize]) -> Any:
        calls.append(job.attempt)
        if job.attempt == 1:
            return {"url": "x", "width": 1}  # a dict, not a Thumbnail
        return Thumbnail("ok", 2)

    job_id = add_job(engine, Resize(1))
    worker.run_until_idle()
    job = wait_for_state(engine, job_id, JobState.COMPLETED)
    assert calls == [1, 2]
    assert "declares output=Thumbnail" in job.errors[0]["error"]
    assert stored_output(engine, job_id) == {"url": "ok", "width": 2}


def test_an_output_over_the_kinds_cap_fails_the_attempt(engine: Engine) -> None:
    worker = make_worker(engine)
    worker.handler(Capped)(lambda job: "x" * job.args.size)
    small, large = add_job(engine, Capped(10)), add_job(engine, Capped(100))
    worker.run_until_idle()
    assert stored_output(engine, small) == "x" * 10
    job = wait_for_state(engine, large, JobState.DISCARDED)
    error = job.errors[-1]["error"]
    assert "OutputTooLargeError" in error and "102 bytes" in error and "cap of 64" in error
    assert stored_output(engine, large) is None


def test_the_workers_cap_applies_to_kinds_without_their_own(engine: Engine) -> None:
    worker = make_worker(engine, max_output_bytes=20)
    worker.handler(Untyped)(lambda job: "y" * 50)
    job_id = add_job(engine, Untyped(), max_attempts=1)
    worker.run_until_idle()
    job = wait_for_state(engine, job_id, JobState.DISCARDED)
    assert "over the cap of 20 bytes" in job.errors[-1]["error"]


def test_bad_output_options_are_refused_when_declared() -> None:
    with pytest.raises(InvalidJobArgsError, match="object"):

        @sa_jobs.job_args(kind="output_bad_type", output=object)
        class Bad:
            n: int = 0

    with pytest.raises(sa_jobs.errors.InvalidOptionsError, match="max_output_bytes"):
        sa_jobs.job_args(kind="output_bad_cap", max_output_bytes=0)


def test_a_bad_worker_cap_is_refused(engine: Engine) -> None:
    with pytest.raises(sa_jobs.errors.InvalidOptionsError, match="max_output_bytes"):
        make_worker(engine, max_output_bytes=-1)


class _NoDelay:
    def next_delay(self, job: Job[Any]) -> float:
        return 0.0


# ------------------------------------------------------------------ complete_in(output=...)


@pytest.mark.usefixtures("effect_table")
def test_complete_in_stores_the_output_with_the_callers_commit(engine: Engine) -> None:
    job_id = add_job(engine, Resize(3))
    job = fetch_one(engine)
    with Session(engine) as session, session.begin():
        write_effect(session, job, "work")
        sa_jobs.complete_in(session, job, output=Thumbnail("/3.png", 3))
        assert stored_output(engine, job_id) is None  # not before the commit
    assert stored_output(engine, job_id) == {"url": "/3.png", "width": 3}
    assert effects(engine) == [(job_id, 1, "work")]


@pytest.mark.usefixtures("effect_table")
def test_complete_in_rolled_back_stores_no_output(engine: Engine) -> None:
    job_id = add_job(engine, Resize(3))
    job = fetch_one(engine)
    with Session(engine) as session:
        session.begin()
        write_effect(session, job, "work")
        sa_jobs.complete_in(session, job, output=Thumbnail("/3.png", 3))
        session.rollback()
    row = get_job(engine, job_id)
    assert row.state is JobState.RUNNING
    assert stored_output(engine, job_id) is None
    assert effects(engine) == []


def test_complete_in_refuses_a_bad_output_before_writing_and_the_session_stays_usable(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Resize(3))
    job = fetch_one(engine)
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidOutputError, match="declares output=Thumbnail"):
            sa_jobs.complete_in(session, job, output="not a thumbnail")
        sa_jobs.complete_in(session, job, output=Thumbnail("fine", 1))
    assert stored_output(engine, job_id) == {"url": "fine", "width": 1}


def test_complete_in_with_an_async_session_stores_the_output(
    engine: Engine, database_url: URL
) -> None:
    job_id = add_job(engine, Untyped())
    job = fetch_one(engine)

    async def scenario() -> None:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                await sa_jobs.complete_in(session, job, output={"async": True})
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    assert stored_output(engine, job_id) == {"async": True}


# ------------------------------------------------------------------ the inline test runner


def test_run_jobs_stores_outputs_like_the_worker(engine: Engine) -> None:
    worker = make_worker(engine)
    worker.handler(Resize)(lambda job: Thumbnail("inline", job.args.image_id))

    @worker.handler(Untyped)
    def with_session(job: Job[Untyped], session: Session) -> list[int]:
        return [job.args.n]

    resize_id = add_job(engine, Resize(4))
    untyped_id = add_job(engine, Untyped(9))
    with Session(engine) as session, session.begin():
        summary = run_jobs(session, worker)
    assert summary.completed == 2
    assert stored_output(engine, resize_id) == {"url": "inline", "width": 4}
    assert stored_output(engine, untyped_id) == [9]


# ------------------------------------------------------------------ without the branch


def test_without_the_output_branch_complete_in_output_names_the_branch(core_only: Engine) -> None:
    add_job(core_only, Untyped())
    job = fetch_one(core_only)
    with (
        Session(core_only) as session,
        session.begin(),
        pytest.raises(SchemaMissingError, match="sa_jobs_output"),
    ):
        sa_jobs.complete_in(session, job, output={"a": 1})


def test_without_the_output_branch_a_worker_with_a_typed_kind_refuses_to_start(
    core_only: Engine,
) -> None:
    worker = make_worker(core_only)
    worker.handler(Resize)(lambda job: None)
    with pytest.raises(SchemaMissingError, match="sa_jobs_output"):
        worker.start()


def test_without_the_output_branch_untyped_return_values_are_dropped_with_a_warning(
    core_only: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(core_only)
    worker.handler(Untyped)(lambda job: {"kept": False})
    job_id = add_job(core_only, Untyped())
    with caplog.at_level(logging.WARNING, logger="sa_jobs.worker"):
        worker.run_until_idle()
    assert get_job(core_only, job_id).state is JobState.COMPLETED
    assert any("not stored" in record.getMessage() for record in caplog.records)


# ------------------------------------------------------------------ job.record_output


def test_a_recorded_output_is_committed_at_once_and_kept_when_the_attempt_fails(
    engine: Engine,
) -> None:
    worker = make_worker(engine)
    seen_during_run: list[Any] = []

    @worker.handler(Untyped)
    def work(job: Job[Untyped]) -> None:
        job.record_output({"step": 1})
        seen_during_run.append(stored_output(engine, job.id))  # another connection sees it
        raise RuntimeError("failed after step 1")

    job_id = add_job(engine, Untyped(), max_attempts=1)
    worker.run_until_idle()
    assert seen_during_run == [{"step": 1}]
    assert wait_for_state(engine, job_id, JobState.DISCARDED)
    assert stored_output(engine, job_id) == {"step": 1}


def test_the_return_value_replaces_a_recorded_output_and_none_keeps_it(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(Untyped)
    def work(job: Job[Untyped]) -> Any:
        job.record_output("progress")
        return {"final": True} if job.args.n else None

    replaced, kept = add_job(engine, Untyped(1)), add_job(engine, Untyped(0))
    worker.run_until_idle()
    assert stored_output(engine, replaced) == {"final": True}
    assert stored_output(engine, kept) == "progress"


def test_record_output_in_an_async_handler_and_with_the_kinds_type(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(AsyncTask)
    async def count(job: Job[AsyncTask]) -> None:
        job.record_output(Totals(count=1, names=["first"]))

    job_id = add_job(engine, AsyncTask())
    worker.run_until_idle()
    assert loaded(engine, job_id).output == Totals(count=1, names=["first"])


def test_record_output_refuses_a_bad_value_in_the_handler(engine: Engine) -> None:
    worker = make_worker(engine)
    raised: list[BaseException] = []

    @worker.handler(Capped)
    def work(job: Job[Capped]) -> None:
        try:
            job.record_output("z" * 100)
        except InvalidOutputError as exc:
            raised.append(exc)

    job_id = add_job(engine, Capped())
    worker.run_until_idle()
    assert [type(exc).__name__ for exc in raised] == ["OutputTooLargeError"]
    assert stored_output(engine, job_id) is None
    assert get_job(engine, job_id).state is JobState.COMPLETED


def test_a_run_that_is_over_cannot_record_an_output(engine: Engine) -> None:
    worker = make_worker(engine, interrupt_grace=0.1)
    outcome: list[BaseException | None] = []
    done = threading.Event()

    @worker.handler(Untyped, timeout=0.1)
    def slow(job: Job[Untyped]) -> None:
        time.sleep(0.6)  # ignores its timeout: the watchdog settles the run without it
        try:
            job.record_output("too late")
            outcome.append(None)
        except JobStateError as exc:
            outcome.append(exc)
        done.set()

    job_id = add_job(engine, Untyped(), max_attempts=1)
    worker.start()
    try:
        assert done.wait(10)
    finally:
        worker.stop(cancel=True)
    assert len(outcome) == 1 and isinstance(outcome[0], JobStateError)
    assert stored_output(engine, job_id) is None


def test_record_output_outside_a_workers_run_is_refused(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    job = loaded(engine, job_id)
    with pytest.raises(JobStateError, match="not being run by a worker"):
        job.record_output({"a": 1})


def test_run_jobs_records_outputs_in_sync_and_async_tests(
    engine: Engine, database_url: URL
) -> None:
    worker = make_worker(engine)

    @worker.handler(Untyped)
    def work(job: Job[Untyped]) -> None:
        job.record_output({"recorded": job.args.n})

    first = add_job(engine, Untyped(1))
    with Session(engine) as session, session.begin():
        assert run_jobs(session, worker).completed == 1
    assert stored_output(engine, first) == {"recorded": 1}

    second = add_job(engine, Untyped(2))

    async def scenario() -> None:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                assert (await run_jobs(session, worker)).completed == 1
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    assert stored_output(engine, second) == {"recorded": 2}


# ------------------------------------------------------------------ shown by the CLI and dashboard


def test_jobs_show_and_the_dashboard_show_the_output_escaped_and_cut_when_long(
    engine: Engine, database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    from sa_jobs.cli import main
    from sa_jobs.dashboard import create_app
    from tests.dashboard import DashboardClient
    from tests.helpers import url_text

    small = add_job(engine, Untyped())
    complete_fetched(engine, {"html": "<b>bold</b>"})
    large = add_job(engine, Untyped())
    complete_fetched(engine, ["x" * 100] * 100)
    none = add_job(engine, Untyped())
    complete_fetched(engine, None)

    assert main(["jobs", "show", str(small), "--url", url_text(database_url)]) == 0
    out = capsys.readouterr().out
    assert 'output:\n  {\n    "html": "<b>bold</b>"\n  }\n' in out
    assert main(["jobs", "show", str(large), "--url", url_text(database_url)]) == 0
    out = capsys.readouterr().out
    assert "more characters; the whole output is in the job's output column" in out
    assert len(out) < 6000
    assert main(["jobs", "show", str(none), "--url", url_text(database_url)]) == 0
    assert "output: none\n" in capsys.readouterr().out

    with DashboardClient(create_app(engine)) as client:
        page = client.get(f"/jobs/{small}").text
        assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page
        assert "more characters" in client.get(f"/jobs/{large}").text
        assert "No output recorded." in client.get(f"/jobs/{none}").text


def complete_fetched(engine: Engine, output: Any) -> None:
    job = fetch_one(engine)
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job, output=output)
