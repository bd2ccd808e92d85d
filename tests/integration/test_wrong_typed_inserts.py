"""Wrong-typed args are refused by every insert path, before anything is written.

And the rule is exact, checked against PostgreSQL's own ``jsonb``: the check accepts a
value exactly when the worker's decode of what ``jsonb`` hands back succeeds and writes
out the same JSON again — the stored job reads back as itself. Args whose every field
holds a value of its declared type are all accepted, and read back as given.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs._base.jsonvalue import dumps, find_unstorable
from sa_jobs._declare.args import kind_of
from sa_jobs.errors import InvalidJobArgsError
from sa_jobs.testing import aware_datetimes, storable_floats, storable_text, values_for_type
from tests.helpers import count_jobs


@sa_jobs.job_args(kind="insert_check.send_email")
class SendEmail:
    to: str
    template: str = "welcome"


@sa_jobs.job_args(kind="insert_check.periodic")
class Tick:
    n: int = 0


WRONG = SendEmail(to=123)  # type: ignore[arg-type]
REFUSED = r"kind 'insert_check.send_email': SendEmail\.to holds 123 \(int\), but it is declared str"


def _enqueue(session: Session) -> None:
    session.add(sa_jobs.enqueue(WRONG))


def _insert(session: Session) -> None:
    sa_jobs.insert(session, WRONG)


def _insert_many(session: Session) -> None:
    sa_jobs.insert_many(session, [SendEmail("ok@example.com"), WRONG])


def _insert_job(session: Session) -> None:
    session.execute(sa_jobs.insert_job(WRONG))


def _job_key(session: Session) -> None:
    sa_jobs.insert(session, WRONG, job_key="mail:123")


def _unique(session: Session) -> None:
    sa_jobs.insert(session, WRONG, unique=sa_jobs.UniqueOpts(by_args=True))


def _hand_built(session: Session) -> None:
    bad = Job(kind="insert_check.send_email", args_json={"to": 123})
    session.add(bad)
    try:
        session.flush()
    finally:
        session.expunge(bad)


PATHS: dict[str, Callable[[Session], None]] = {
    "enqueue": _enqueue,
    "insert": _insert,
    "insert_many": _insert_many,
    "insert_job": _insert_job,
    "job_key": _job_key,
    "unique": _unique,
    "hand_built_job": _hand_built,
}


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
def test_every_insert_path_refuses_wrong_typed_args_and_the_session_goes_on(
    engine: Engine, path: Callable[[Session], None]
) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, SendEmail("before@example.com"))
        with pytest.raises(InvalidJobArgsError, match=REFUSED if path is not _hand_built else "to"):
            path(session)
        assert count_jobs(session) == 1
        sa_jobs.insert(session, SendEmail("after@example.com"))

    with Session(engine) as session:
        assert sorted(job.args.to for job in session.scalars(select(Job))) == [
            "after@example.com",
            "before@example.com",
        ]


def test_an_async_session_refuses_them_too(engine: Engine) -> None:
    async def scenario() -> int:
        async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                await sa_jobs.insert(session, SendEmail("ok@example.com"))
                with pytest.raises(InvalidJobArgsError, match=REFUSED):
                    await sa_jobs.insert(session, WRONG)
                with pytest.raises(InvalidJobArgsError, match=REFUSED):
                    await sa_jobs.insert_many(session, [WRONG])
            async with AsyncSession(async_engine) as session:
                return int(await session.scalar(text("SELECT count(*) FROM sa_job")) or 0)
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == 1


def test_a_periodic_factorys_wrong_typed_args_fail_the_tick_not_the_worker(
    engine: Engine,
) -> None:
    periodic = sa_jobs.PeriodicJob(
        dt.timedelta(hours=1),
        lambda: Tick(n="seven"),  # type: ignore[arg-type]
        name="insert_check.tick",
        run_on_start=True,
    )
    with pytest.raises(InvalidJobArgsError, match=r"Tick\.n holds 'seven' \(str\)"):
        periodic.build_args()
    assert count_jobs(engine) == 0


# --------------------------------------------------------------------------- the exact rule


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Inner:
    label: str
    size: int


@sa_jobs.job_args(kind="insert_check.mixed")
class Mixed:
    text: str
    count: int
    ratio: float
    flag: bool
    maybe: int | None
    either: int | str
    when: dt.datetime
    day: dt.date
    amount: Decimal
    ident: uuid.UUID
    color: Color
    numbers: list[int]
    pair: tuple[int, str]
    counts: dict[str, float]
    inner: Inner
    inners: list[Inner]


#: What a careless caller might put in any field.
ANY_VALUE: st.SearchStrategy[Any] = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    storable_floats(),
    storable_text(max_size=5),
    st.sampled_from(["1", "0", "true", "1.5", "red", "2024-01-01", "2024-01-01T00:00:00+00:00"]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(max_value=9) | storable_text(max_size=2), max_size=3),
    st.dictionaries(storable_text(max_size=3), st.integers(max_value=9) | st.none(), max_size=2),
    aware_datetimes(),
    st.dates(),
    st.decimals(allow_nan=False, allow_infinity=False, places=2),
    st.uuids(),
    st.sampled_from(Color),
    st.builds(Inner, storable_text(max_size=3), st.integers()),
)


@st.composite
def mixed_args(draw: st.DrawFn) -> tuple[Mixed, set[str]]:
    """Args of the declared types, except for up to three fields (named in the second
    item) given anything at all."""
    attrs.resolve_types(Mixed)
    fields = attrs.fields(Mixed)
    careless = draw(st.sets(st.sampled_from([f.name for f in fields]), max_size=3))
    values = {
        f.name: draw(ANY_VALUE if f.name in careless else values_for_type(f.type)) for f in fields
    }
    return Mixed(**values), careless


def stored_by_jsonb(engine: Engine, document: Any) -> Any:
    """``document`` as the worker gets it back: through a ``jsonb`` value."""
    with engine.connect() as connection:
        return connection.scalar(text("SELECT CAST(:doc AS jsonb)"), {"doc": dumps(document)})


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: booleans apart from numbers, numbers by decimal value, arrays alike."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same_json(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return (
            isinstance(a, list | tuple)
            and isinstance(b, list | tuple)
            and len(a) == len(b)
            and all(same_json(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        # As jsonb's numeric compares them: the decimals their JSON text stands for.
        return Decimal(repr(a)) == Decimal(repr(b))
    return type(a) is type(b) and bool(a == b)


def same_value(given: Any, back: Any) -> bool:
    """Whether the worker's ``back`` is the ``given`` value, judged on Python values: an
    int may come back as the float it equals (a float field); a datetime must keep its
    instant and its offset."""
    if attrs.has(type(given)):
        return type(back) is type(given) and all(
            same_value(getattr(given, f.name), getattr(back, f.name))
            for f in attrs.fields(type(given))
        )
    if isinstance(given, dt.datetime):
        return (
            isinstance(back, dt.datetime)
            and back.replace(tzinfo=None) == given.replace(tzinfo=None)
            and back.utcoffset() == given.utcoffset()
        )
    if isinstance(given, Decimal):
        return isinstance(back, Decimal) and given.compare_total(back) == 0
    if isinstance(given, bool) or isinstance(back, bool):
        return type(given) is type(back) and given == back
    if isinstance(given, int | float) and isinstance(back, int | float):
        return given == back
    if isinstance(given, dict):
        return given.keys() == back.keys() and all(same_value(v, back[k]) for k, v in given.items())
    if isinstance(given, list | tuple):
        return len(back) == len(given) and all(
            same_value(a, b) for a, b in zip(given, back, strict=True)
        )
    return type(given) is type(back) and bool(given == back)


@pytest.fixture
def outcomes() -> Iterator[Counter[str]]:
    counted: Counter[str] = Counter()
    yield counted


def test_the_check_accepts_exactly_the_rows_that_read_back_as_themselves(
    engine: Engine, outcomes: Counter[str]
) -> None:
    kind = kind_of(Mixed)
    cattrs_converter = kind.converter.cattrs

    # Derandomized: the coverage check below counts outcomes of random draws, and with a
    # fresh seed each run it fell short now and then (7 of 10 "undecodable"); a fixed
    # sequence of draws makes it a property of the strategy, not of luck.
    @settings(
        max_examples=300,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mixed_args())
    def rule(drawn: tuple[Mixed, set[str]]) -> None:
        args, careless = drawn
        try:
            kind.encode(args)
            accepted = True
        except InvalidJobArgsError as exc:
            accepted = False
            note(f"refused: {exc}")
        if not careless:
            assert accepted, "refused a value of the declared types"

        # The oracle: what the worker would make of the row without the check.
        try:
            raw = cattrs_converter.unstructure(args, unstructure_as=Mixed)
        except Exception:
            raw = None
        if raw is None or find_unstorable(raw) is not None:
            assert not accepted, "accepted a value that cannot even be written"
            outcomes["unwritable"] += 1
            return
        stored = stored_by_jsonb(engine, raw)
        note(f"stored: {stored!r}")
        try:
            back = kind.decode(stored)
        except InvalidJobArgsError:
            assert not accepted, "accepted a value the worker's decode fails on"
            outcomes["undecodable"] += 1
            event("refused: the worker could not decode it")
            return
        note(f"read back: {back!r}")
        itself = same_json(stored, cattrs_converter.unstructure(back, unstructure_as=Mixed))
        assert accepted == itself, (
            "accepted a row that reads back as other JSON"
            if accepted
            else "refused a row that reads back as itself"
        )
        if not careless:
            assert same_value(args, back), "a well-typed value came back changed"
            outcomes["well-typed"] += 1
        outcomes["accepted" if accepted else "changed"] += 1
        event("accepted" if accepted else "refused: it would come back changed")

    rule()
    # Every outcome must have been exercised, not just the easy one.
    kinds = ("accepted", "well-typed", "changed", "undecodable", "unwritable")
    assert min(outcomes[k] for k in kinds) >= 10, outcomes
