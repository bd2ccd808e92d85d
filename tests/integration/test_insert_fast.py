"""``sa_jobs.insert_many_fast``: plain jobs through COPY, the rest through the statement.

Every driver: ``tests/integration/test_drivers.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertAction, Job, JobState, UniqueOpts
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs.errors import InvalidJobArgsError, SchemaMissingError
from sa_jobs.hooks import InsertingJob, add_insert_hook, remove_insert_hook
from sa_jobs.worker.producer import fetch_jobs

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_fast_plain")
class Plain:
    text: str
    n: int = 0


@sa_jobs.job_args(kind="test_fast_keyed", partition_by=["tenant"])
class Keyed:
    tenant: str


def stored(engine: Engine) -> list[Job[Any]]:
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


# Every character COPY's text format or an array literal delimits, and some that JSON does.
AWKWARD = 'tab\there, line\nbreak, cr\r, back\\slash, "quotes", {braces}, comma, é, \\N, 😀'


def test_copied_jobs_are_stored_exactly_as_insert_many_stores_them(engine: Engine) -> None:
    options = {"queue": "bulk", "priority": 3, "max_attempts": 7, "tags": [AWKWARD, "b"]}
    metadata = {"who": AWKWARD, "nested": [1, None, True]}
    with Session(engine) as session, session.begin():
        count = sa_jobs.insert_many_fast(
            session, [Plain(AWKWARD, 1), Plain("x", 2)], metadata=metadata, **options
        )
        sa_jobs.insert_many(
            session, [Plain(AWKWARD, 1), Plain("x", 2)], metadata=metadata, **options
        )
    assert count == 2
    copied, inserted = stored(engine)[:2], stored(engine)[2:]
    columns = (
        "kind",
        "args_json",
        "queue",
        "priority",
        "max_attempts",
        "tags",
        "metadata_",
        "state",
    )
    for fast, slow in zip(copied, inserted, strict=True):
        assert [getattr(fast, c) for c in columns] == [getattr(slow, c) for c in columns]
    assert copied[0].args == Plain(AWKWARD, 1)
    assert copied[0].state is JobState.AVAILABLE
    assert copied[0].id < copied[1].id  # input order


def test_copied_jobs_are_worked_and_the_workers_hear_of_them(
    engine: Engine, database_url: URL
) -> None:
    url = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN sa_jobs_insert")
        with Session(engine) as session, session.begin():
            sa_jobs.insert_many_fast(session, [Plain("a"), Plain("b")], queue="heard")
        heard = [note.payload for note in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["heard"]
    fetched = fetch_jobs(engine, "heard", 10, "test-fast", features=ALL_FEATURES)
    assert sorted(job.args.text for job in fetched) == ["a", "b"]


def test_a_rolled_back_transaction_leaves_no_copied_job(engine: Engine) -> None:
    with Session(engine) as session:
        session.begin()
        assert sa_jobs.insert_many_fast(session, [Plain("a")] * 3) == 3
        session.rollback()
    assert stored(engine) == []


def test_bad_args_anywhere_write_nothing_and_leave_the_session_usable(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidJobArgsError):
            sa_jobs.insert_many_fast(session, [Plain("a"), Plain(5)])  # type: ignore[arg-type]
        assert sa_jobs.insert_many_fast(session, [Plain("ok")]) == 1
    assert [job.args.text for job in stored(engine)] == ["ok"]


def test_jobs_the_statement_must_write_go_through_it_in_their_place(engine: Engine) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    once = UniqueOpts(by_args=True)
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Plain("taken"), unique=once)
        count = sa_jobs.insert_many_fast(
            session,
            [
                Plain("first"),
                sa_jobs.InsertManyParams(Plain("later"), sa_jobs.InsertOpts(scheduled_at=later)),
                sa_jobs.InsertManyParams(Plain("taken"), sa_jobs.InsertOpts(unique=once)),
                sa_jobs.InsertManyParams(Plain("new"), sa_jobs.InsertOpts(unique=once)),
                Plain("last"),
            ],
        )
    # The duplicate of "taken" is skipped and not counted.
    assert count == 4
    jobs = stored(engine)
    assert [job.args.text for job in jobs] == ["taken", "first", "later", "new", "last"]
    assert jobs[2].state is JobState.SCHEDULED  # on the database clock


def test_partition_keys_are_copied(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many_fast(session, [Keyed("acme"), Plain("none"), Keyed(AWKWARD)])
    with engine.connect() as connection:
        keys = connection.scalars(select(Job.partition_key).order_by(Job.id)).all()
    assert keys == ["acme", None, AWKWARD]


def test_a_missing_schema_branch_is_named(core_only: Engine) -> None:
    with (
        Session(core_only) as session,
        session.begin(),
        pytest.raises(SchemaMissingError, match="sa_jobs_fairness"),
    ):
        sa_jobs.insert_many_fast(session, [Keyed("acme")])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []

    def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
        for job in jobs:
            job.metadata["stamped"] = True
        self.calls.append(("before", [job.kind for job in jobs]))

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        self.calls.append(("after", [(job.id, job.action) for job in jobs]))


def test_insert_hooks_see_every_job_and_their_changes_are_copied(engine: Engine) -> None:
    hook = Recorder()
    add_insert_hook(hook)
    try:
        with Session(engine) as session, session.begin():
            sa_jobs.insert_many_fast(session, [Plain("a"), Plain("b")])
    finally:
        remove_insert_hook(hook)
    assert hook.calls == [
        ("before", ["test_fast_plain", "test_fast_plain"]),
        ("after", [(None, InsertAction.INSERTED)] * 2),
    ]
    assert [job.metadata_ for job in stored(engine)] == [{"stamped": True}] * 2


def test_batches_are_copied_whole(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        assert (
            sa_jobs.insert_many_fast(session, [Plain(str(n)) for n in range(25)], batch_size=10)
            == 25
        )
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM sa_job")) == 25
