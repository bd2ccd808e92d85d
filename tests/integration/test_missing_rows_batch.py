"""The worker checks the rows a fetched batch references with one query per table for
the whole batch (``worker/missing_rows.check_batch``), not one per job, and a batch it
cannot check falls back to each job's own check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs
from sa_jobs import JobState, Ref
from sa_jobs._table.models import Job
from tests.helpers import make_worker

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")
QUEUE = "missing_rows_batch"


class Base(DeclarativeBase):
    pass


class Parcel(Base):
    __tablename__ = "batchcheck_parcel"
    id: Mapped[int] = mapped_column(primary_key=True)  # SERIAL


class Never(Base):
    """A mapped class whose table is never created: its check fails."""

    __tablename__ = "batchcheck_never_created"
    id: Mapped[int] = mapped_column(primary_key=True)


@sa_jobs.job_args(kind="test_batchcheck_ship", queue=QUEUE)
class Ship:
    parcel: Ref[Parcel]


@sa_jobs.job_args(kind="test_batchcheck_broken", queue=QUEUE, max_attempts=3)
class Broken:
    never: Ref[Never]


@pytest.fixture
def parcels(engine: Engine) -> Iterator[list[int]]:
    Parcel.__table__.drop(engine, checkfirst=True)  # type: ignore[attr-defined]
    Parcel.__table__.create(engine)  # type: ignore[attr-defined]
    with Session(engine) as session, session.begin():
        rows = [Parcel() for _ in range(10)]
        session.add_all(rows)
        session.flush()
        ids = [row.id for row in rows]
        session.add_all([sa_jobs.enqueue(Ship(Ref(Parcel, pid))) for pid in ids])
    yield ids
    Parcel.__table__.drop(engine)  # type: ignore[attr-defined]


def _count_selects_of(engine: Engine, table: str) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and table in statement:
            seen.append(statement)

    return seen


def states(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(select(Job.state, func.count()).group_by(Job.state))
        return {str(state.value): count for state, count in rows}


@pytest.mark.parametrize("takes_session", [True, False])
def test_a_batch_costs_one_query_per_table(
    engine: Engine, parcels: list[int], takes_session: bool
) -> None:
    with engine.begin() as connection:  # three rows go, by a bulk DELETE
        connection.execute(
            text("DELETE FROM batchcheck_parcel WHERE id = ANY(:ids)"), {"ids": parcels[:3]}
        )
    ran: list[int] = []
    worker = make_worker(engine, queues={QUEUE: 10})
    if takes_session:
        worker.handler(Ship)(lambda job, session: ran.append(job.args.parcel.pk[0]))
    else:
        worker.handler(Ship)(lambda job: ran.append(job.args.parcel.pk[0]))
    selects = _count_selects_of(engine, "batchcheck_parcel")
    worker.run_until_idle(timeout=30)
    # One batch of ten jobs, one SELECT of the parcels (one per job before).
    assert len(selects) == 1, selects
    assert sorted(ran) == parcels[3:]
    assert states(engine) == {"completed": 7, "cancelled": 3}


def test_a_batch_that_cannot_be_checked_fails_each_attempt_not_the_worker(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Broken(Ref(Never, 1)))
    worker = make_worker(engine, queues={QUEUE: 2})
    worker.handler(Broken)(lambda job: None)
    worker.run_until_idle(timeout=30)
    with Session(engine) as session:
        job = session.scalars(select(Job)).one()
        assert job.state is JobState.RETRYABLE
        assert "batchcheck_never_created" in job.errors[0]["error"]
