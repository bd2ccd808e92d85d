"""Job args survive the trip through PostgreSQL's jsonb column, whatever they hold.

``jsonb`` is not a byte store: numbers become ``numeric`` (``1e20`` reads back as the
integer ``100000000000000000000``, ``-0.0`` as ``0``), keys are reordered, NUL and lone
surrogates are refused. The converter must either refuse a value up front or give back
exactly what went in.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections import Counter
from decimal import Decimal

import attrs
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs._declare.convert import default_converter
from sa_jobs.errors import InvalidJobArgsError
from sa_jobs.testing import args_values, assert_same_args, unstorable_reason


class Plan(enum.StrEnum):
    FREE = "free"
    PRO = "pro"
    ENTERPRISE = "enterprise"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class LineItem:
    sku: str
    quantity: int
    unit_price: Decimal
    shipped_at: dt.datetime | None = None


@sa_jobs.job_args(kind="test_args_roundtrip.everything")
class Everything:
    text: str
    count: int
    ratio: float
    flag: bool
    maybe_text: str | None
    maybe_ratio: float | None
    when: dt.datetime
    maybe_when: dt.datetime | None
    day: dt.date
    ident: uuid.UUID
    amount: Decimal
    plan: Plan
    level: Level
    item: LineItem
    maybe_item: LineItem | None
    items: list[LineItem]
    counts: list[int]
    ratios: list[float]
    names: tuple[str, ...]
    pair: tuple[uuid.UUID, Decimal]
    history: list[dt.datetime]
    by_name: dict[str, LineItem]
    amounts: dict[str, Decimal]
    days: dict[str, list[dt.date]]
    plans: dict[str, Plan]


def test_every_storable_value_reads_back_unchanged_and_the_rest_is_refused(
    engine: Engine,
) -> None:
    outcomes: Counter[str] = Counter()

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # Found by this test: CPython 3.11's fromisoformat reads "+00:00:00.000001" as UTC,
    # so the converter must refuse sub-second offsets rather than move the instant.
    @example(attrs.evolve(_an_everything(), when=_ONE_MICROSECOND_EAST))
    @given(
        st.one_of(
            args_values(Everything),
            args_values(Everything, include_unstorable=True),
        )
    )
    def roundtrip(original: Everything) -> None:
        reason = unstorable_reason(original)
        try:
            default_converter.to_json(original)
        except InvalidJobArgsError as exc:
            assert reason is not None, f"the converter refused a storable value: {exc}"
            outcomes["refused"] += 1
            event("refused before insert")
            return
        assert reason is None, f"the converter accepted an unstorable value: {reason}"
        outcomes["stored"] += 1
        event("stored")

        with Session(engine) as session, session.begin():
            job_id = sa_jobs.insert(session, original).job.id

        with Session(engine) as session:
            job = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
            note(f"stored JSON: {job.args_json!r}")
            assert job.extras.args_of is None, "job.args must decode, not reuse"
            assert_same_args(original, job.args)

    roundtrip()
    # Both halves of the property must have been exercised, not just one.
    assert outcomes["stored"] >= 30, outcomes
    assert outcomes["refused"] >= 10, outcomes


def test_numbers_jsonb_rewrites_still_decode_to_the_same_floats(engine: Engine) -> None:
    original = attrs.evolve(
        _an_everything(),
        ratio=1e20,
        maybe_ratio=-0.0,
        ratios=[5e-324, 1.7976931348623157e308, -1e-7, 0.1],
    )

    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, original).job.id

    with Session(engine) as session:
        job = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
        assert job.args_json["ratio"] == 100000000000000000000
        assert isinstance(job.args_json["ratio"], int)
        assert_same_args(original, job.args)


_ONE_MICROSECOND_EAST = dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(microseconds=1)))


def _an_everything() -> Everything:
    item = LineItem("sku-1", 2, Decimal("9.90"))
    return Everything(
        text="héllo 🌍",
        count=2**70,
        ratio=0.5,
        flag=True,
        maybe_text=None,
        maybe_ratio=None,
        when=dt.datetime(2024, 3, 10, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=-7))),
        maybe_when=None,
        day=dt.date(2024, 2, 29),
        ident=uuid.UUID(int=1),
        amount=Decimal("0.10"),
        plan=Plan.PRO,
        level=Level.HIGH,
        item=item,
        maybe_item=None,
        items=[item],
        counts=[1, -1],
        ratios=[],
        names=("a", "b"),
        pair=(uuid.UUID(int=2), Decimal("1E+3")),
        history=[],
        by_name={"first": item},
        amounts={"x": Decimal("-0")},
        days={"d": [dt.date(1, 1, 1)]},
        plans={"p": Plan.FREE},
    )
