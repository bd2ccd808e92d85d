"""Dataclass args and the pydantic recipe, through PostgreSQL and back.

Each test writes jobs with the public insert paths, reads the row back in a new session
(so ``job.args`` is decoded from ``jsonb``, not reused) and compares with what went in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs.testing import aware_datetimes, storable_text
from tests.args_compare import comparable
from tests.doc_recipes import load_recipe
from tests.helpers import make_worker

recipe = load_recipe("job-args.md", "Pydantic models")


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    unit_price: Decimal
    shipped_at: dt.datetime | None = None


@attrs.frozen
class Note:
    text: str


@sa_jobs.job_args(kind="test_args_classes.invoice")
@dataclasses.dataclass(frozen=True, slots=True)
class SendInvoice:
    invoice_id: uuid.UUID
    due: dt.date
    lines: tuple[Line, ...] = ()
    note: Note | None = None
    by_code: dict[str, Line] = dataclasses.field(default_factory=dict)


@sa_jobs.job_args(kind="test_args_classes.draft", frozen=False)
@dataclasses.dataclass
class Draft:
    body: str
    revisions: int = 0


@sa_jobs.job_args(kind="test_args_classes.ping", unique=sa_jobs.UniqueOpts(by_args=True))
@dataclasses.dataclass(frozen=True)
class Ping:
    host: str
    port: int = 443


def _load(engine: Engine, job_id: int) -> Any:
    with Session(engine) as session:
        job = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
        assert job.extras.args_of is None, "job.args must decode, not reuse"
        return job.args, job.args_json


AN_INVOICE = SendInvoice(
    uuid.UUID(int=7),
    dt.date(2024, 2, 29),
    (Line("tea", Decimal("3.50"), dt.datetime(2024, 3, 1, 9, tzinfo=dt.UTC)),),
    Note("thanks"),
    {"t": Line("tea", Decimal("3.50"))},
)


def test_a_dataclass_inserted_comes_back_equal(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, AN_INVOICE).job.id

    args, stored = _load(engine, job_id)

    assert args == AN_INVOICE
    assert type(args.lines[0]) is Line
    assert type(args.note) is Note
    assert stored["lines"][0]["unit_price"] == "3.50"


def test_every_insert_path_takes_dataclasses(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        added = sa_jobs.enqueue(Draft("a", 1))
        session.add(added)
        many = sa_jobs.insert_many(session, [Draft("b"), Draft("c", 3)])
        core = session.execute(sa_jobs.insert_job(Draft("d"))).one().id
    ids = [added.id, *(result.job.id for result in many), core]

    assert [_load(engine, job_id)[0] for job_id in ids] == [
        Draft("a", 1),
        Draft("b"),
        Draft("c", 3),
        Draft("d"),
    ]


def test_unique_by_args_on_a_dataclass_uses_all_its_args(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, Ping("example.com"))
        again = sa_jobs.insert(session, Ping("example.com", 443))
        other = sa_jobs.insert(session, Ping("example.com", 80))

    assert not first.unique_skipped_as_duplicate
    assert again.unique_skipped_as_duplicate and again.job.id == first.job.id
    assert not other.unique_skipped_as_duplicate


def test_a_handler_receives_the_dataclass(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, AN_INVOICE)
    seen: list[SendInvoice] = []
    worker = make_worker(engine)

    @worker.handler(SendInvoice)
    def handle(job: Job) -> None:
        seen.append(job.args)

    worker.run_until_idle()

    assert seen == [AN_INVOICE]


def test_the_pydantic_recipe_round_trips_through_the_database(engine: Engine) -> None:
    address = recipe.ShippingAddress(
        street="1 Main St",
        city="Lyon",
        confirmed_at=dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    )
    original = recipe.GeocodeAddress(42, address, previous=None)

    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, original).job.id
    args, stored = _load(engine, job_id)

    assert args == original
    assert type(args.address) is recipe.ShippingAddress
    assert stored["address"]["confirmed_at"] == "2024-05-01T12:00:00+02:00"


lines = st.builds(
    Line, storable_text(), st.decimals(allow_nan=False, allow_infinity=False), aware_datetimes()
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.builds(
        SendInvoice,
        st.uuids(),
        st.dates(),
        st.lists(lines, max_size=3).map(tuple),
        st.none() | st.builds(Note, storable_text()),
        st.dictionaries(storable_text(), lines, max_size=2),
    )
)
def test_any_storable_dataclass_args_come_back_equal(engine: Engine, invoice: Any) -> None:
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, invoice).job.id

    args, _ = _load(engine, job_id)

    # Wall time and offset, not ==: a zone's fold time compares unequal to its offset.
    assert comparable(args) == comparable(invoice)
    # A Decimal keeps its exponent: 1.50 does not come back as 1.5.
    assert [str(line.unit_price) for line in args.lines] == [
        str(line.unit_price) for line in invoice.lines
    ]
