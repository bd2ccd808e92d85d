"""Helpers for testing code that uses sa_jobs: Hypothesis strategies and unique keys.

``import sa_jobs`` never imports Hypothesis; this module needs it (``pip install
hypothesis``). Everything here is public and stable enough to build your own property
tests on.

**Job args**

* :func:`args_values` draws instances of any job args class from its type annotations
  (``str``, ``int``, ``float``, ``bool``, ``None``, aware ``datetime``, ``date``,
  ``UUID``, ``Decimal``, enums, nested attrs classes, unions, ``list``, ``tuple``,
  ``set``, ``frozenset`` and ``dict`` of these, and ``sa_jobs.Ref[Model]``: references
  with keys drawn from the model's primary-key types, :func:`ref_values`). With
  ``include_unstorable=True`` it also draws what cannot be stored faithfully — NUL
  characters, lone surrogates, NaN and infinities, naive datetimes, sub-second UTC
  offsets — so a test can check the converter refuses them. :func:`values_for_type`
  does the same for one annotation.
* :func:`unstorable_reason` says, independently of the converter, why a value cannot be
  stored faithfully (or ``None`` when it can).
* :func:`assert_same_args` compares an original value with its decoded copy, stricter
  than ``==`` where ``==`` is lenient (types, a Decimal's exponent) and exact about what a
  stored datetime keeps (wall time and UTC offset).

**Unique jobs**

* :func:`unique_opts` draws valid :class:`~sa_jobs.UniqueOpts`; every dimension can be
  pinned or narrowed. :func:`unique_states` draws valid ``by_state`` values and
  :func:`incomplete_unique_states` invalid ones (missing a required state).
* :func:`unique_key` and :func:`canonical_unique_key` compute, without a database, the
  key an insert would store (``Job.unique_key``) and its canonical bytes — so you can
  check that your options make exactly the jobs you mean collide::

      from hypothesis import given
      from sa_jobs.testing import args_values, unique_key

      @given(args_values(ReconcileAccount), args_values(ReconcileAccount))
      def test_one_job_per_account(a, b):
          same_key = unique_key(a) == unique_key(b)
          assert same_key == (a.account_id == b.account_id)
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import types
import typing
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import attrs

from sa_jobs._declare.refs import Ref, is_ref_type, mapper_of, ref_model

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "sa_jobs.testing needs Hypothesis: pip install hypothesis "
        "(sa_jobs itself works without it; only this module of test helpers needs it)"
    ) from exc

from sa_jobs._base.durations import MAX_TTL
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import encode_args
from sa_jobs._declare.options import REQUIRED_UNIQUE_STATES, InsertOpts, UniqueOpts, insert_opts
from sa_jobs._declare.unique_sequence_keys import key_digest
from sa_jobs._insert.unique import unique_key_bytes
from sa_jobs.errors import a_or_an

__all__ = [
    "COMMON_DURATIONS",
    "any_floats",
    "any_text",
    "args_values",
    "assert_same_args",
    "aware_datetimes",
    "canonical_unique_key",
    "durations",
    "fixed_offsets",
    "incomplete_unique_states",
    "ref_values",
    "storable_floats",
    "storable_text",
    "unique_key",
    "unique_opts",
    "unique_states",
    "unstorable_reason",
    "values_for_type",
]

#: Collections drawn for args stay small: the interesting cases are in the elements.
MAX_COLLECTION_SIZE = 4

_MAX_OFFSET = dt.timedelta(hours=24) - dt.timedelta(microseconds=1)


# --------------------------------------------------------------------------- scalars


def storable_text(*, max_size: int = 20) -> st.SearchStrategy[str]:
    """Any text ``jsonb`` stores unchanged: every Unicode scalar value except NUL."""
    return st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=max_size
    )


def any_text(*, max_size: int = 20) -> st.SearchStrategy[str]:
    """The full alphabet, including NUL and lone surrogates (which ``jsonb`` refuses).

    Hypothesis draws surrogates only when asked, so they get their own share.
    """
    alphabet = st.one_of(
        st.characters(exclude_categories=()),
        st.characters(categories=["Cs"]),
        st.just("\x00"),
    )
    return st.text(alphabet=alphabet, max_size=max_size)


def storable_floats() -> st.SearchStrategy[float]:
    """Finite floats, including -0.0, subnormals and the largest magnitudes."""
    return st.floats(allow_nan=False, allow_infinity=False)


def any_floats() -> st.SearchStrategy[float]:
    """Every float, NaN and infinities included."""
    return st.floats()


def fixed_offsets(*, sub_second: bool = False) -> st.SearchStrategy[dt.timezone]:
    """``datetime.timezone`` offsets over the whole allowed range (-24 h, +24 h).

    Args:
        sub_second: Draw offsets to the microsecond, which no ISO 8601 reader is obliged
            to accept; by default offsets are whole seconds (like historical LMT offsets).
    """
    offsets = st.timedeltas(min_value=-_MAX_OFFSET, max_value=_MAX_OFFSET)
    if not sub_second:
        # Truncate toward zero: flooring -23:59:59.999999 would give -24:00, out of range.
        offsets = offsets.map(lambda offset: dt.timedelta(seconds=int(offset.total_seconds())))
    return st.builds(dt.timezone, offsets)


def aware_datetimes() -> st.SearchStrategy[dt.datetime]:
    """Aware datetimes in IANA zones (folds and gaps included) and in fixed offsets."""
    zones: st.SearchStrategy[dt.tzinfo] = st.one_of(
        st.timezones(), fixed_offsets(), st.just(dt.UTC)
    )
    return st.datetimes(timezones=zones)


def _any_datetimes() -> st.SearchStrategy[dt.datetime]:
    return st.one_of(
        aware_datetimes(),
        st.datetimes(),
        st.datetimes(timezones=fixed_offsets(sub_second=True)),
    )


# --------------------------------------------------------------------------- by type


def values_for_type(tp: Any, *, include_unstorable: bool = False) -> st.SearchStrategy[Any]:
    """A strategy for values of the annotation ``tp``, as job args would hold them.

    Raises:
        TypeError: ``tp`` is not a type job args can hold.
    """

    def values(inner: Any) -> st.SearchStrategy[Any]:
        return values_for_type(inner, include_unstorable=include_unstorable)

    origin = typing.get_origin(tp)
    params = typing.get_args(tp)
    if is_ref_type(tp):
        return ref_values(tp)
    if tp is None or tp is types.NoneType:
        return st.none()
    if origin is typing.Union or origin is types.UnionType:
        return st.one_of(*(values(param) for param in params))
    if origin is typing.Literal:
        return st.sampled_from(params)
    if origin is list:
        return st.lists(values(params[0]), max_size=MAX_COLLECTION_SIZE)
    if origin in (set, frozenset):
        elements = st.sets(values(params[0]), max_size=MAX_COLLECTION_SIZE)
        return elements if origin is set else elements.map(frozenset)
    if origin is tuple:
        if len(params) == 2 and params[1] is Ellipsis:
            return st.lists(values(params[0]), max_size=MAX_COLLECTION_SIZE).map(tuple)
        return st.tuples(*(values(param) for param in params))
    if origin is dict:
        return st.dictionaries(values(params[0]), values(params[1]), max_size=MAX_COLLECTION_SIZE)
    if isinstance(tp, type):
        return _values_for_class(tp, include_unstorable=include_unstorable)
    raise TypeError(f"no strategy for the annotation {tp!r}")


def ref_values(tp: Any) -> st.SearchStrategy[Ref[Any]]:
    """References ``Ref(Model, pk)`` for the annotation ``Ref[Model]``, the key drawn from
    the primary-key columns' Python types (the rows need not exist).

    Raises:
        TypeError: a bare ``Ref``, or a key column of a type with no strategy.
    """
    model = ref_model(tp)
    if model is None:
        raise TypeError("no strategy for a bare Ref; name its model: Ref[Invoice]")
    columns = list(mapper_of(model).primary_key)
    keys = []
    for column in columns:
        python_type = column.type.python_type
        keys.append(
            st.integers(min_value=1, max_value=2**31 - 1)
            if python_type is int
            else _values_for_class(python_type, include_unstorable=False)
        )
    return st.tuples(*keys).map(lambda pk: Ref(model, pk))


def _values_for_class(cls: type, *, include_unstorable: bool) -> st.SearchStrategy[Any]:
    # Order matters: bool is an int, datetime is a date, a str enum is a str.
    if issubclass(cls, enum.Enum):
        return st.sampled_from(cls)
    if cls is bool:
        return st.booleans()
    if cls is int:
        return st.integers()
    if cls is float:
        return any_floats() if include_unstorable else storable_floats()
    if cls is str:
        return any_text() if include_unstorable else storable_text()
    if cls is Decimal:
        return st.decimals()
    if cls is uuid.UUID:
        return st.uuids()
    if cls is dt.datetime:
        return _any_datetimes() if include_unstorable else aware_datetimes()
    if cls is dt.date:
        return st.dates()
    if attrs.has(cls):
        return args_values(cls, include_unstorable=include_unstorable)
    raise TypeError(f"no strategy for the class {cls.__qualname__}")


def args_values(cls: type, *, include_unstorable: bool = False) -> st.SearchStrategy[Any]:
    """Instances of the attrs (or job args) class ``cls``, every field drawn from its type.

    Args:
        cls: An attrs class; string annotations are resolved first.
        include_unstorable: Also draw values ``jsonb`` cannot store faithfully.
    """

    def deferred(tp: Any) -> st.SearchStrategy[Any]:
        # Built on first draw, so a class that refers to itself (through Optional) does
        # not recurse here.
        return st.deferred(lambda: values_for_type(tp, include_unstorable=include_unstorable))

    attrs.resolve_types(cls)
    fields = {field.alias: deferred(field.type) for field in attrs.fields(cls) if field.init}
    return st.builds(cls, **fields)


# --------------------------------------------------------------------------- oracles


def unstorable_reason(value: Any) -> str | None:
    """Why ``value`` cannot be stored and read back unchanged, or ``None`` when it can.

    What ``jsonb`` refuses or alters (NUL, lone surrogates, NaN and infinities, non-string
    keys), what is ambiguous (naive datetimes), and what the ISO 8601 form cannot carry
    back (a UTC offset with a fraction of a second). Judged from the Python value alone,
    so a test can hold the converter to it: the converter must refuse exactly these.
    """
    if isinstance(value, str):
        if "\x00" in value:
            return f"NUL character in {value!r}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"lone surrogate in {value!r}"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"non-finite float {value}"
    if isinstance(value, dt.datetime):
        offset = value.utcoffset()
        if offset is None:
            return f"naive datetime {value}"
        if offset % dt.timedelta(seconds=1):
            # CPython 3.11's fromisoformat reads "+00:00:00.000001" back as UTC.
            return f"UTC offset with a fraction of a second in {value.isoformat()}"
        return None
    if isinstance(value, enum.Enum):
        return unstorable_reason(value.value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            reason = _key_reason(key) or unstorable_reason(item)
            if reason:
                return reason
        return None
    if isinstance(value, list | tuple | set | frozenset):
        return next(filter(None, map(unstorable_reason, value)), None)
    if attrs.has(type(value)):
        return next(
            filter(
                None, (unstorable_reason(getattr(value, f.name)) for f in attrs.fields(type(value)))
            ),
            None,
        )
    return None


def _key_reason(key: Any) -> str | None:
    stringy = isinstance(key, str | uuid.UUID | Decimal | dt.date) or (
        isinstance(key, enum.Enum) and isinstance(key.value, str)
    )
    if not stringy:
        return f"dict key {key!r} is not a string"
    return unstorable_reason(key)


def assert_same_args(expected: Any, actual: Any, path: str = "args") -> None:
    """Assert ``actual`` (decoded from storage) carries exactly what ``expected`` held.

    Stricter than ``==``: types must match (a float stays a float, a tuple a tuple, an
    enum field holds the member), and a Decimal keeps its exponent (``1.50`` is not
    ``1.5``). A datetime must keep its wall time and its UTC offset; the tzinfo object
    itself comes back as a fixed offset (the stored ISO string names no zone).
    ``-0.0`` may come back as ``0.0``: ``jsonb`` stores numbers as ``numeric``.
    """
    if type(actual) is not type(expected) and not (
        isinstance(expected, dt.datetime) and isinstance(actual, dt.datetime)
    ):
        raise AssertionError(
            f"{path}: expected {a_or_an(type(expected).__name__)} {expected!r}, "
            f"got {a_or_an(type(actual).__name__)} {actual!r}"
        )
    if attrs.has(type(expected)):
        for field in attrs.fields(type(expected)):
            assert_same_args(
                getattr(expected, field.name), getattr(actual, field.name), f"{path}.{field.name}"
            )
    elif isinstance(expected, dt.datetime):
        same = (
            actual.replace(tzinfo=None) == expected.replace(tzinfo=None)
            and actual.utcoffset() == expected.utcoffset()
        )
        if not same:
            raise AssertionError(
                f"{path}: expected {expected.isoformat()} ({expected!r}), "
                f"got {actual.isoformat()} ({actual!r})"
            )
    elif isinstance(expected, Decimal):
        if expected.compare_total(actual) != 0:
            raise AssertionError(f"{path}: expected Decimal({str(expected)!r}), got {actual!r}")
    elif isinstance(expected, enum.Enum):
        if actual is not expected:
            raise AssertionError(f"{path}: expected {expected!r}, got {actual!r}")
    elif isinstance(expected, dict):
        if set(actual) != set(expected):
            raise AssertionError(f"{path}: expected keys {set(expected)!r}, got {set(actual)!r}")
        for key, item in expected.items():
            assert_same_args(item, actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        if len(actual) != len(expected):
            raise AssertionError(f"{path}: expected {expected!r}, got {actual!r}")
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            assert_same_args(want, got, f"{path}[{index}]")
    elif actual != expected:
        raise AssertionError(f"{path}: expected {expected!r}, got {actual!r}")


# --------------------------------------------------------------------------- unique jobs

COMMON_DURATIONS: tuple[dt.timedelta, ...] = (
    dt.timedelta(seconds=1),
    dt.timedelta(minutes=1),
    dt.timedelta(minutes=15),
    dt.timedelta(hours=1),
    dt.timedelta(hours=24),
    dt.timedelta(days=7),
)
"""Durations people actually configure, tried before arbitrary ones."""


def durations(
    *,
    min_value: dt.timedelta = dt.timedelta(seconds=1),
    max_value: dt.timedelta = MAX_TTL,
) -> st.SearchStrategy[dt.timedelta]:
    """Durations valid for ``by_period`` and ``ttl`` (1 second to 365 days by default),
    common ones first.

    Raises:
        ValueError: ``min_value`` is not positive or exceeds ``max_value``.
    """
    if min_value <= dt.timedelta(0) or min_value > max_value:
        raise ValueError(f"need 0 < min_value <= max_value, got {min_value} and {max_value}")
    common = [d for d in COMMON_DURATIONS if min_value <= d <= max_value]
    arbitrary = st.timedeltas(min_value=min_value, max_value=max_value)
    return st.one_of(st.sampled_from(common), arbitrary) if common else arbitrary


def _in_declaration_order(states: Iterable[JobState]) -> list[JobState]:
    order = list(JobState)
    return sorted(states, key=order.index)


def unique_states(*, allow_default: bool = True) -> st.SearchStrategy[frozenset[JobState] | None]:
    """Valid ``by_state`` values: the required states plus any others.

    Args:
        allow_default: Also draw ``None`` (the default: every state but cancelled and
            discarded).
    """
    optional = _in_declaration_order(frozenset(JobState) - REQUIRED_UNIQUE_STATES)
    custom = st.sets(st.sampled_from(optional)).map(
        lambda extra: frozenset(REQUIRED_UNIQUE_STATES | extra)
    )
    return st.one_of(st.none(), custom) if allow_default else custom


def incomplete_unique_states() -> st.SearchStrategy[list[JobState]]:
    """``by_state`` lists that leave out at least one required state (and are not empty:
    ``[]`` means the default states, as in River).

    ``UniqueOpts(by_state=...)`` must refuse each of them with an error naming what is
    missing.
    """
    return (
        st.sets(st.sampled_from(list(JobState)), min_size=1)
        .filter(lambda states: not REQUIRED_UNIQUE_STATES.issubset(states))
        .map(_in_declaration_order)
    )


_DEFAULT = object()


def _strategy(value: Any, default: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    if value is _DEFAULT:
        return default
    if isinstance(value, st.SearchStrategy):
        return value
    return st.just(value)


def unique_opts(
    *,
    by_args: Any = _DEFAULT,
    by_period: Any = _DEFAULT,
    by_queue: Any = _DEFAULT,
    by_state: Any = _DEFAULT,
    exclude_kind: Any = _DEFAULT,
    ttl: Any = _DEFAULT,
    until: Any = _DEFAULT,
    allow_empty: bool = False,
) -> st.SearchStrategy[UniqueOpts]:
    """Valid :class:`~sa_jobs.UniqueOpts`.

    Each argument is a strategy for that field or a fixed value; left out, the field is
    drawn from everything valid (``by_period`` and ``ttl`` from ``None`` or
    :func:`durations`, ``by_state`` from :func:`unique_states`). For example, the options
    of a daily job that may vary only by queue and states::

        unique_opts(by_args=True, by_period=dt.timedelta(days=1), ttl=None)

    Args:
        allow_empty: Also draw ``UniqueOpts()`` — no uniqueness at all.
    """
    built = st.builds(
        UniqueOpts,
        by_args=_strategy(by_args, st.booleans()),
        by_period=_strategy(by_period, st.none() | durations()),
        by_queue=_strategy(by_queue, st.booleans()),
        by_state=_strategy(by_state, unique_states()),
        exclude_kind=_strategy(exclude_kind, st.booleans()),
        ttl=_strategy(ttl, st.none() | durations()),
        until=_strategy(until, st.sampled_from(["success", "start"])),
    )
    return built if allow_empty else built.filter(lambda opts: not opts.is_empty)


def canonical_unique_key(
    args: object,
    opts: InsertOpts | None = None,
    *,
    now: dt.datetime | None = None,
    **options: Any,
) -> bytes | None:
    """The canonical bytes of the unique key an insert of ``args`` would store.

    Options are those of :func:`sa_jobs.insert` (an :class:`~sa_jobs.InsertOpts` and/or
    keywords such as ``unique=``, ``queue=``, ``scheduled_at=``); the kind's declared
    defaults fill in the rest, as on insert. ``now`` is the insert time ``by_period``
    uses when no ``scheduled_at`` is given (default: the current time). Returns ``None``
    when the job would not be unique. The format is described in
    :mod:`sa_jobs._declare.unique_sequence_keys`.
    """
    kind, args_json = encode_args(args)
    resolved = insert_opts(opts, options).resolve(kind.defaults)
    unique = resolved.unique
    if unique is None or unique.is_empty:
        return None
    if now is None:
        now = dt.datetime.now(dt.UTC)
    elif now.utcoffset() is None:
        raise ValueError(f"now={now.isoformat()} is naive; pass a time-zone-aware datetime")
    return unique_key_bytes(kind, args_json, resolved, unique, now)


def unique_key(
    args: object,
    opts: InsertOpts | None = None,
    *,
    now: dt.datetime | None = None,
    **options: Any,
) -> bytes | None:
    """The unique key (SHA-256 digest) an insert of ``args`` would store in
    ``Job.unique_key``, or ``None`` when the job would not be unique.

    Same arguments as :func:`canonical_unique_key`.
    """
    canonical = canonical_unique_key(args, opts, now=now, **options)
    return None if canonical is None else key_digest(canonical)
