"""Hypothesis strategies for job args, and the oracles that judge a round trip.

Written so they could move to ``sa_jobs/testing.py`` unchanged: nothing here depends on
the test suite.

* :func:`args_values` draws instances of any job args class from its type annotations
  (``str``, ``int``, ``float``, ``bool``, ``None``, aware ``datetime``, ``date``,
  ``UUID``, ``Decimal``, enums, nested attrs classes, unions, ``list``, ``tuple``,
  ``set``, ``frozenset`` and ``dict`` of these). With ``include_unstorable=True`` it also
  draws what cannot be stored faithfully — NUL characters, lone surrogates, NaN and
  infinities, naive datetimes, sub-second UTC offsets — so a test can check the converter
  refuses them.
* :func:`unstorable_reason` says, independently of the converter, why a value cannot be
  stored faithfully (or ``None`` when it can).
* :func:`assert_same_args` compares an original value with its decoded copy, stricter
  than ``==`` where ``==`` is lenient (types, a Decimal's exponent) and exact about what a
  stored datetime keeps (wall time and UTC offset).
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import types
import typing
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs
from hypothesis import strategies as st

__all__ = [
    "any_floats",
    "any_text",
    "args_values",
    "assert_same_args",
    "aware_datetimes",
    "fixed_offsets",
    "storable_floats",
    "storable_text",
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
        offsets = offsets.map(lambda offset: offset - offset % dt.timedelta(seconds=1))
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
            f"{path}: expected a {type(expected).__name__} {expected!r}, "
            f"got a {type(actual).__name__} {actual!r}"
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
