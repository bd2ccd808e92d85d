"""Declaring job args, converting them to JSON and back, and validating insert options.

No database here: "stored" JSON is what the converter produced, passed through
``json.dumps``/``json.loads`` the way every insert path sends it. What ``jsonb`` itself
does to values is covered by ``tests/integration/test_args_roundtrip.py``.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from sqlalchemy.dialects import postgresql

import sa_jobs
from sa_jobs._base.durations import MAX_TIMEOUT
from sa_jobs._base.jsonvalue import dumps
from sa_jobs._declare.args import FIELD_METADATA_KEY, default_registry, kind_of
from sa_jobs._declare.convert import ArgsConverter, default_converter
from sa_jobs._declare.options import UNSET, InsertOpts, KindDefaults, ResolvedInsert
from sa_jobs.errors import (
    DuplicateKindError,
    InvalidJobArgsError,
    InvalidOptionsError,
    SaJobsError,
    UnknownKindError,
)
from tests.unit import future_annotated_args

# Most classes here go into a private registry so the suite's global registry stays clean.
REGISTRY = sa_jobs.KindRegistry()


class Color(enum.StrEnum):
    RED = "red"
    GREEN = "green"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


@attrs.frozen
class Address:
    street: str
    moved_in: dt.date | None = None


@sa_jobs.job_args(kind="test_args.when", registry=REGISTRY)
class When:
    at: dt.datetime


@sa_jobs.job_args(kind="test_args.scalars", registry=REGISTRY)
class Scalars:
    day: dt.date
    ident: uuid.UUID
    amount: Decimal
    color: Color
    size: Size
    ratio: float = 0.0
    flag: bool = False


@sa_jobs.job_args(kind="test_args.customer", registry=REGISTRY)
class Customer:
    name: str
    address: Address
    previous: list[Address] = attrs.Factory(list)
    by_label: dict[str, Address] = attrs.Factory(dict)
    history: tuple[dt.datetime, ...] = ()
    pair: tuple[uuid.UUID, Decimal] | None = None
    nickname: str | None = None
    colors: dict[str, list[Color]] = attrs.Factory(dict)


@sa_jobs.job_args(kind="test_args.free_form", registry=REGISTRY)
class FreeForm:
    text: str = ""
    ratio: float = 0.0
    ratios: list[float] = attrs.Factory(list)
    labels: dict[str, str] = attrs.Factory(dict)
    anything: dict[Any, Any] = attrs.Factory(dict)
    blob: bytes | None = None


@sa_jobs.job_args(kind="test_args.sets", registry=REGISTRY)
class WithSets:
    ids: set[int] = attrs.Factory(set)
    names: frozenset[str] = frozenset()


@sa_jobs.job_args(kind="test_args.versioned", registry=REGISTRY)
class Versioned:
    name: str
    retries: int = 3


def stored(args: object) -> Any:
    """The JSON an insert would send for ``args``, as the database hands it back."""
    return json.loads(dumps(kind_of(args).encode(args)))


def roundtrip(args: object) -> Any:
    return kind_of(args).decode(stored(args))


# --------------------------------------------------------------------------- declaring


def test_job_args_turns_a_plain_class_into_a_frozen_attrs_class() -> None:
    registry = sa_jobs.KindRegistry()

    @sa_jobs.job_args(kind="reconcile", registry=registry)
    class Reconcile:
        account_id: int
        trace_id: str = ""

    args = Reconcile(7)
    assert args == Reconcile(account_id=7, trace_id="")
    assert hash(args) == hash(Reconcile(7))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        args.account_id = 8  # type: ignore[misc]
    assert "__attrs_attrs__" in Reconcile.__dict__


def test_frozen_false_makes_instances_mutable() -> None:
    registry = sa_jobs.KindRegistry()

    @sa_jobs.job_args(kind="draft", registry=registry, frozen=False)
    class Draft:
        body: str = ""

    draft = Draft()
    draft.body = "edited"
    assert draft.body == "edited"


def test_an_existing_attrs_class_is_registered_as_it_is() -> None:
    registry = sa_jobs.KindRegistry()

    @attrs.define
    class Existing:
        n: int

    declared = sa_jobs.job_args(kind="existing", registry=registry)(Existing)

    assert declared is Existing
    assert registry.get("existing").args_class is Existing


def test_the_class_is_registered_under_its_kind_with_its_defaults() -> None:
    registry = sa_jobs.KindRegistry()

    @sa_jobs.job_args(
        kind="send_email",
        registry=registry,
        queue="mail",
        priority=2,
        max_attempts=5,
        tags=["email", "outbound"],
        timeout=dt.timedelta(seconds=30),
    )
    class SendEmail:
        to: str

    kind = registry.get("send_email")
    assert kind.name == "send_email"
    assert kind.args_class is SendEmail
    assert kind.converter is default_converter
    assert kind.defaults == KindDefaults(
        queue="mail",
        priority=2,
        max_attempts=5,
        tags=("email", "outbound"),
        timeout=dt.timedelta(seconds=30),
    )
    assert "send_email" in registry
    assert registry.names() == ["send_email"]
    assert "send_email" not in default_registry


def test_kind_of_works_on_the_class_and_on_an_instance() -> None:
    assert kind_of(Scalars).name == "test_args.scalars"
    instance = Scalars(dt.date(2024, 1, 1), uuid.UUID(int=0), Decimal(0), Color.RED, Size.SMALL)
    assert kind_of(instance) is kind_of(Scalars)


def test_kind_of_a_plain_class_says_to_decorate_it() -> None:
    class NotArgs:
        pass

    with pytest.raises(InvalidJobArgsError, match=r"NotArgs is not a job args class") as exc:
        kind_of(NotArgs())
    assert "@sa_jobs.job_args(kind=...)" in str(exc.value)
    with pytest.raises(InvalidJobArgsError, match="not a job args class"):
        kind_of(NotArgs)
    with pytest.raises(InvalidJobArgsError, match="int is not a job args class"):
        kind_of(42)


def test_looking_up_an_unregistered_kind_names_it() -> None:
    with pytest.raises(UnknownKindError, match="'nobody_declared_this'") as exc:
        sa_jobs.KindRegistry().get("nobody_declared_this")
    assert isinstance(exc.value, LookupError)
    assert exc.value.kind == "nobody_declared_this"


# --------------------------------------------------------------------------- kinds are unique


def test_a_second_class_claiming_a_taken_kind_is_refused() -> None:
    registry = sa_jobs.KindRegistry()

    @sa_jobs.job_args(kind="charge", registry=registry)
    class Charge:
        cents: int

    with pytest.raises(DuplicateKindError) as exc:

        @sa_jobs.job_args(kind="charge", registry=registry)
        class Refund:
            cents: int

    assert isinstance(exc.value, SaJobsError)
    assert exc.value.kind == "charge"
    assert exc.value.existing is Charge
    message = str(exc.value)
    assert f"{Charge.__module__}.{Charge.__qualname__}" in message
    assert "Refund" in message
    assert "different kind=" in message
    assert registry.get("charge").args_class is Charge


def test_same_qualname_from_another_module_is_a_different_class() -> None:
    registry = sa_jobs.KindRegistry()
    first: type[Any] = sa_jobs.job_args(kind="shared", registry=registry)(
        type("Shared", (), {"__module__": "app.billing"})
    )
    impostor = type("Shared", (), {"__module__": "app.shipping"})

    with pytest.raises(DuplicateKindError, match=r"app\.billing\.Shared.*app\.shipping\.Shared"):
        sa_jobs.job_args(kind="shared", registry=registry)(impostor)
    assert registry.get("shared").args_class is first


def test_the_default_registry_refuses_a_duplicate_kind_too() -> None:
    kind = f"test_args.default.{uuid.uuid4().hex}"

    @sa_jobs.job_args(kind=kind)
    class First:
        n: int

    with pytest.raises(DuplicateKindError):

        @sa_jobs.job_args(kind=kind)
        class Second:
            n: int

    assert default_registry.get(kind).args_class is First
    assert kind_of(First(1)).name == kind


def _declare_report(registry: sa_jobs.KindRegistry | None, kind: str) -> type:
    # Every call makes a new class object with the same module and qualname, the way
    # re-executing a module (a reload, a script run twice) does.
    @sa_jobs.job_args(kind=kind, registry=registry)
    class Report:
        n: int

    return Report


def test_redefining_the_same_class_replaces_the_registration() -> None:
    registry = sa_jobs.KindRegistry()
    old = _declare_report(registry, "report")
    new = _declare_report(registry, "report")

    assert new is not old
    assert registry.get("report").args_class is new
    assert kind_of(old(1)).args_class is old


def test_redefining_the_same_class_in_the_default_registry_is_allowed() -> None:
    kind = f"test_args.redefined.{uuid.uuid4().hex}"
    _declare_report(None, kind)
    new = _declare_report(None, kind)

    assert default_registry.get(kind).args_class is new


# --------------------------------------------------------------------------- kind names


@pytest.mark.parametrize(
    "kind",
    ["", "   ", None, 7, b"bytes_kind", "k" * 129],
    ids=["empty", "blank", "none", "int", "bytes", "129-chars"],
)
def test_a_bad_kind_name_is_refused_at_declaration(kind: Any) -> None:
    registry = sa_jobs.KindRegistry()
    with pytest.raises(InvalidJobArgsError, match="kind"):
        sa_jobs.job_args(kind=kind, registry=registry)
    assert registry.names() == []


def test_a_kind_of_128_characters_is_accepted() -> None:
    registry = sa_jobs.KindRegistry()
    sa_jobs.job_args(kind="k" * 128, registry=registry)(type("Long", (), {}))
    assert "k" * 128 in registry


@pytest.mark.parametrize("kind", ["nul\x00kind", "surrogate\udc00"], ids=["nul", "surrogate"])
def test_a_kind_name_the_database_cannot_store_is_refused_at_declaration(kind: str) -> None:
    # The kind travels inside the jsonb parameter of every insert: PostgreSQL would refuse
    # the whole statement, long after the class was declared.
    with pytest.raises(InvalidJobArgsError, match="kind"):
        sa_jobs.job_args(kind=kind, registry=sa_jobs.KindRegistry())


# --------------------------------------------------------------------------- per-kind defaults


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("priority", 0),
        ("priority", 5),
        ("priority", True),
        ("max_attempts", 0),
        ("max_attempts", 32_768),
        ("queue", ""),
        ("queue", "q" * 129),
        ("tags", ["t" * 256]),
        ("tags", ["t"] * 65),
        ("timeout", dt.timedelta(0)),
        ("timeout", 0),
        ("timeout", "30s"),
    ],
    ids=lambda value: repr(value)[:20],
)
def test_a_bad_per_kind_default_is_refused_at_declaration(option: str, value: Any) -> None:
    registry = sa_jobs.KindRegistry()
    with pytest.raises(InvalidOptionsError) as exc:
        sa_jobs.job_args(kind="bad_defaults", registry=registry, **{option: value})
    assert exc.value.option == option
    assert str(exc.value).startswith(f"{option}: ")
    assert "bad_defaults" not in registry


def test_a_single_string_as_default_tags_is_refused_not_split_into_letters() -> None:
    # InsertOpts(tags="billing") is refused; job_args(tags="billing") must be too, instead
    # of declaring the tags ("b", "i", "l", "l", "i", "n", "g").
    registry = sa_jobs.KindRegistry()
    with pytest.raises(InvalidOptionsError) as exc:
        sa_jobs.job_args(kind="billing", registry=registry, tags="billing")
    assert exc.value.option == "tags"
    assert "billing" not in registry


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_timeout_that_is_not_a_finite_number_is_an_options_error(timeout: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="finite") as exc:
        sa_jobs.job_args(kind="bad_timeout", registry=sa_jobs.KindRegistry(), timeout=timeout)
    assert exc.value.option == "timeout"


@pytest.mark.parametrize(
    "timeout",
    [10**400, 1e300, dt.timedelta.max, dt.timedelta(days=366)],
    ids=["huge-int", "huge-float", "timedelta.max", "a-year-and-a-day"],
)
def test_a_timeout_past_the_maximum_is_clamped_to_it(timeout: Any) -> None:
    # A timeout past threading's range used to kill the watchdog thread (OverflowError).
    @sa_jobs.job_args(kind="long_timeout", registry=sa_jobs.KindRegistry(), timeout=timeout)
    class LongRunning:
        n: int = 0

    assert kind_of(LongRunning).defaults.timeout == MAX_TIMEOUT == dt.timedelta(days=365)


@pytest.mark.parametrize(
    ("declared", "recorded"),
    [
        (dt.timedelta(minutes=5), dt.timedelta(minutes=5)),
        (30, dt.timedelta(seconds=30)),
        (0.5, dt.timedelta(milliseconds=500)),
        (None, None),
        (-1, None),
        (dt.timedelta(seconds=-1), None),
    ],
    ids=["timedelta", "int-seconds", "float-seconds", "none", "minus-one", "negative"],
)
def test_a_declared_timeout_is_recorded_in_one_form(declared: Any, recorded: Any) -> None:
    # The worker should not have to know that 30 means seconds or that -1 means no limit.
    registry = sa_jobs.KindRegistry()
    cls: type[Any] = sa_jobs.job_args(kind="timed", registry=registry, timeout=declared)(
        type("Timed", (), {})
    )
    assert kind_of(cls).defaults.timeout == recorded


def test_an_undeclared_timeout_stays_unset() -> None:
    assert kind_of(Versioned).defaults.timeout is UNSET


# --------------------------------------------------------------------------- fields


@sa_jobs.job_args(kind="test_args.keyed", registry=REGISTRY)
class Keyed:
    account_id: int = sa_jobs.field(unique=True, sequence=True)
    region: str = sa_jobs.field(unique=True, default="eu")
    trace_id: str = sa_jobs.field(default="", metadata={"doc": "for logs only"})
    notes: list[str] = sa_jobs.field(factory=list)
    plain: str = ""


def test_field_records_its_key_flags_in_attrs_metadata() -> None:
    fields = attrs.fields(Keyed)

    assert FIELD_METADATA_KEY == "sa_jobs"
    assert fields.account_id.metadata["sa_jobs"] == {"unique": True, "sequence": True}
    assert fields.region.metadata["sa_jobs"] == {"unique": True, "sequence": False}
    assert fields.trace_id.metadata["sa_jobs"] == {"unique": False, "sequence": False}
    assert fields.trace_id.metadata["doc"] == "for logs only"
    assert "sa_jobs" not in fields.plain.metadata


def test_field_keeps_attrs_defaults_and_factories() -> None:
    first, second = Keyed(1), Keyed(2)

    assert first.region == "eu"
    assert first.trace_id == ""
    assert first.notes == [] and first.notes is not second.notes
    assert roundtrip(Keyed(3, notes=["a"])) == Keyed(3, notes=["a"])


# --------------------------------------------------------------------------- datetimes


@pytest.mark.parametrize(
    "at",
    [
        dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC),
        dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
        dt.datetime(2024, 1, 15, 9, 0, tzinfo=ZoneInfo("America/New_York")),
        dt.datetime(2024, 7, 15, 9, 0, tzinfo=ZoneInfo("America/New_York")),
        dt.datetime(2024, 7, 15, 9, 0, tzinfo=ZoneInfo("Asia/Kathmandu")),
        dt.datetime(1900, 1, 1, tzinfo=ZoneInfo("Africa/Monrovia")),
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=14))),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(-dt.timedelta(hours=12))),
    ],
    ids=[
        "utc",
        "plus-0530",
        "minus-0300",
        "new-york-winter",
        "new-york-summer",
        "kathmandu-0545",
        "monrovia-lmt-seconds",
        "year-1",
        "year-9999",
    ],
)
def test_an_aware_datetime_comes_back_as_the_same_instant_and_offset(at: dt.datetime) -> None:
    data = stored(When(at))
    back = kind_of(When).decode(data)

    assert data == {"at": at.isoformat()}
    assert back.at.replace(tzinfo=None) == at.replace(tzinfo=None)
    assert back.at.utcoffset() == at.utcoffset()
    assert back == When(at)


def test_a_zoneinfo_datetime_in_a_dst_fold_keeps_its_instant_but_not_its_zone() -> None:
    # 02:30 happens twice in Paris on 2024-10-27; fold=1 is the second time (+01:00).
    second_time = dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris"))

    back = roundtrip(When(second_time)).at

    assert stored(When(second_time)) == {"at": "2024-10-27T02:30:00+01:00"}
    assert back.timestamp() == second_time.timestamp()
    assert back.utcoffset() == dt.timedelta(hours=1)
    # What is not kept: the zone's rules. ISO 8601 has no zone names.
    assert back.tzinfo == dt.timezone(dt.timedelta(hours=1))


@pytest.mark.parametrize(
    "offset",
    [dt.timedelta(microseconds=1), -dt.timedelta(microseconds=500_000)],
    ids=["plus-1us", "minus-half-second"],
)
def test_a_sub_second_utc_offset_is_not_silently_turned_into_utc(offset: dt.timedelta) -> None:
    # CPython 3.11's datetime.fromisoformat reads "+00:00:00.000001" as UTC: the instant
    # moves. Either keep the offset or refuse it up front.
    at = dt.datetime(2000, 1, 1, tzinfo=dt.timezone(offset))
    try:
        back = roundtrip(When(at)).at
    except InvalidJobArgsError:
        return
    assert back.utcoffset() == offset


def test_a_naive_datetime_is_refused_with_a_hint_to_use_an_aware_one() -> None:
    with pytest.raises(InvalidJobArgsError) as exc:
        kind_of(When).encode(When(dt.datetime(2024, 5, 1, 12, 30)))

    message = str(exc.value)
    assert "naive datetime 2024-05-01T12:30:00" in message
    assert "time-zone-aware datetime" in message
    assert "datetime.now(timezone.utc)" in message


def test_a_naive_datetime_deep_inside_the_args_is_refused_too() -> None:
    customer = Customer(
        "ada",
        Address("1 Main St"),
        history=(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 1, 2)),
    )
    with pytest.raises(InvalidJobArgsError, match="naive datetime"):
        kind_of(customer).encode(customer)


def test_a_stored_datetime_without_an_offset_does_not_load() -> None:
    with pytest.raises(InvalidJobArgsError, match="do not convert to When") as exc:
        kind_of(When).decode({"at": "2024-05-01T12:30:00"})
    assert "$.at" in str(exc.value)


# --------------------------------------------------------------------------- other scalars


def test_dates_uuids_decimals_and_enums_are_stored_as_json_strings_and_numbers() -> None:
    args = Scalars(
        day=dt.date(2024, 2, 29),
        ident=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        amount=Decimal("19.90"),
        color=Color.GREEN,
        size=Size.LARGE,
        ratio=0.25,
        flag=True,
    )

    assert stored(args) == {
        "day": "2024-02-29",
        "ident": "12345678-1234-5678-1234-567812345678",
        "amount": "19.90",
        "color": "green",
        "size": 2,
        "ratio": 0.25,
        "flag": True,
    }
    back = roundtrip(args)
    assert back == args
    assert back.color is Color.GREEN
    assert back.size is Size.LARGE
    assert type(back.ident) is uuid.UUID


@pytest.mark.parametrize(
    "amount",
    [
        "0.1000000000000000000000000001",
        "1.50",
        "-0",
        "1E+400",
        "123456789012345678901234567890.123456789",
        "Infinity",
    ],
)
def test_a_decimal_is_kept_exactly_including_its_exponent(amount: str) -> None:
    args = Scalars(dt.date(2024, 1, 1), uuid.UUID(int=0), Decimal(amount), Color.RED, Size.SMALL)

    data = stored(args)
    back = roundtrip(args).amount

    assert data["amount"] == str(Decimal(amount))
    assert back.compare_total(Decimal(amount)) == 0


# --------------------------------------------------------------------------- structure


def test_nested_classes_lists_dicts_tuples_and_optionals_round_trip() -> None:
    home = Address("1 Main St", moved_in=dt.date(2020, 6, 1))
    customer = Customer(
        name="Ada",
        address=home,
        previous=[Address("2 Old Rd"), Address("3 Older Ln", dt.date(2001, 1, 1))],
        by_label={"work": Address("4 Office Pk"), "home": home},
        history=(dt.datetime(2024, 1, 1, tzinfo=dt.UTC),),
        pair=(uuid.UUID(int=5), Decimal("2.50")),
        nickname="ada",
        colors={"fav": [Color.GREEN, Color.RED]},
    )

    data = stored(customer)
    back = roundtrip(customer)

    assert data["address"] == {"street": "1 Main St", "moved_in": "2020-06-01"}
    assert data["previous"][0] == {"street": "2 Old Rd", "moved_in": None}
    assert data["history"] == ["2024-01-01T00:00:00+00:00"]
    assert data["pair"] == ["00000000-0000-0000-0000-000000000005", "2.50"]
    assert data["colors"] == {"fav": ["green", "red"]}
    assert back == customer
    assert type(back.history) is tuple
    assert type(back.pair) is tuple
    assert type(back.address) is Address


def test_optional_fields_store_null_and_come_back_as_none() -> None:
    customer = Customer("Bo", Address("5 Lane"))

    data = stored(customer)

    assert data["nickname"] is None
    assert data["pair"] is None
    assert roundtrip(customer) == customer


def test_sets_round_trip_as_the_docs_promise() -> None:
    # docs/job-args.md lists `set` among what converts; the converter refuses it today.
    args = WithSets(ids={3, 1, 2}, names=frozenset({"a", "b"}))

    data = stored(args)

    assert sorted(data["ids"]) == [1, 2, 3]
    assert roundtrip(args) == args


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_float_is_refused(value: float) -> None:
    for args in (FreeForm(ratio=value), FreeForm(ratios=[1.0, value])):
        with pytest.raises(InvalidJobArgsError, match="use None or a Decimal"):
            kind_of(args).encode(args)


def test_floats_survive_jsonb_storing_numbers_as_numeric() -> None:
    # jsonb hands back 1e20 as the integer 100000000000000000000 and -0.0 as 0.
    back = kind_of(FreeForm).decode({"ratio": 100000000000000000000, "ratios": [0, 5, 0.5]})

    assert back.ratio == 1e20
    assert type(back.ratio) is float
    assert back.ratios == [0.0, 5.0, 0.5]
    assert all(type(value) is float for value in back.ratios)


# --------------------------------------------------------------------------- strings and keys


@pytest.mark.parametrize(
    "args",
    [FreeForm(text="a\x00b"), FreeForm(labels={"k": "\x00"}), FreeForm(labels={"k\x00": "v"})],
    ids=["value", "dict-value", "dict-key"],
)
def test_a_string_holding_nul_is_refused(args: FreeForm) -> None:
    with pytest.raises(InvalidJobArgsError, match="NUL character"):
        kind_of(args).encode(args)


@pytest.mark.parametrize(
    "args",
    [FreeForm(text="\ud800"), FreeForm(text="ok \udfff"), FreeForm(labels={"\udc80": "v"})],
    ids=["high", "low", "dict-key"],
)
def test_a_string_holding_a_lone_surrogate_is_refused(args: FreeForm) -> None:
    with pytest.raises(InvalidJobArgsError, match="not valid Unicode"):
        kind_of(args).encode(args)


def test_any_valid_unicode_round_trips() -> None:
    text = 'héllo \U0001f30d \uffff \u2028 \t\n"\\ 中文 \U0010ffff'
    args = FreeForm(text=text, labels={text: text})

    assert roundtrip(args) == args


def test_a_dict_key_that_is_not_a_string_is_refused() -> None:
    args = FreeForm(anything={1: "one"})
    with pytest.raises(InvalidJobArgsError, match=r"dict key 1 \(int\); JSON object keys must"):
        kind_of(args).encode(args)


def test_a_type_the_converter_does_not_know_asks_for_a_hook() -> None:
    args = FreeForm(blob=b"\x01\x02")
    with pytest.raises(InvalidJobArgsError, match=r"bytes.*register an unstructure hook"):
        kind_of(args).encode(args)


# ----------------------------------------------------------------- stored JSON vs the class


def test_extra_stored_keys_from_another_version_of_the_class_are_ignored() -> None:
    back = kind_of(Versioned).decode({"name": "x", "retries": 1, "removed_field": [1, 2]})
    assert back == Versioned("x", 1)


def test_a_field_added_with_a_default_loads_from_older_jobs() -> None:
    assert kind_of(Versioned).decode({"name": "x"}) == Versioned("x", 3)


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        ({"retries": 1}, "name"),
        ({"name": "x", "retries": "many"}, "retries"),
        ({"name": "x", "retries": None}, "retries"),
        (["x", 1], ""),
        ("x", ""),
    ],
    ids=["missing-field", "wrong-type", "null", "array", "string"],
)
def test_stored_json_that_no_longer_fits_the_class_names_the_class(data: Any, detail: str) -> None:
    with pytest.raises(InvalidJobArgsError) as exc:
        kind_of(Versioned).decode(data)

    message = str(exc.value)
    assert "stored args do not convert to Versioned" in message
    assert detail in message
    assert "give new fields defaults" in message


# --------------------------------------------------------------------------- string annotations


def test_string_annotations_resolve_in_the_declaring_module_even_forward_ones() -> None:
    invoice = future_annotated_args.Invoice(
        total=Decimal("12.00"),
        lines=[
            future_annotated_args.InvoiceLine(
                "widget", Decimal("12.00"), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
            )
        ],
        due=dt.date(2024, 2, 1),
    )

    data = stored(invoice)
    back = roundtrip(invoice)

    assert data["total"] == "12.00"
    assert data["lines"][0]["booked_at"] == "2024-01-01T00:00:00+00:00"
    assert back == invoice
    assert type(back.lines[0]) is future_annotated_args.InvoiceLine


def test_an_annotation_only_type_checkers_can_see_is_reported_with_the_class() -> None:
    args = future_annotated_args.TypeCheckingOnly(uuid.UUID(int=1))
    with pytest.raises(
        InvalidJobArgsError, match="cannot resolve the type annotations of TypeCheckingOnly"
    ):
        kind_of(args).encode(args)


# --------------------------------------------------------------------------- own converter


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents = cents
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (
            other.cents,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


MONEY_CONVERTER = ArgsConverter()
MONEY_CONVERTER.cattrs.register_unstructure_hook(
    Money, lambda money: {"cents": money.cents, "cur": money.currency}
)
MONEY_CONVERTER.cattrs.register_structure_hook(
    Money, lambda data, _: Money(data["cents"], data["cur"])
)


@sa_jobs.job_args(kind="test_args.charge", registry=REGISTRY, converter=MONEY_CONVERTER)
class Charge:
    amount: Money
    at: dt.datetime


def test_a_kind_with_its_own_converter_uses_its_hooks() -> None:
    charge = Charge(Money(1250, "EUR"), dt.datetime(2024, 1, 1, tzinfo=dt.UTC))

    assert kind_of(Charge).converter is MONEY_CONVERTER
    assert stored(charge) == {
        "amount": {"cents": 1250, "cur": "EUR"},
        "at": "2024-01-01T00:00:00+00:00",
    }
    assert roundtrip(charge) == charge


def test_a_kinds_own_converter_is_what_the_insert_statement_sends() -> None:
    # insert_job finds the kind through the class, so Charge's private registry is fine.
    charge = Charge(Money(5, "USD"), dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
    statement = sa_jobs.insert_job(charge)

    rows = statement.compile(dialect=postgresql.dialect()).params["sa_jobs_rows"]

    assert rows[0]["kind"] == "test_args.charge"
    assert rows[0]["args"] == {
        "amount": {"cents": 5, "cur": "USD"},
        "at": "2024-01-01T00:00:00+00:00",
    }


def test_a_kinds_own_converter_leaves_the_default_one_alone() -> None:
    charge = Charge(Money(1, "EUR"), dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
    with pytest.raises(InvalidJobArgsError, match="Money"):
        default_converter.to_json(charge)


# --------------------------------------------------------------------------- insert options


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("priority", 0),
        ("priority", 5),
        ("priority", -1),
        ("priority", True),
        ("priority", 2.0),
        ("priority", "1"),
        ("max_attempts", 0),
        ("max_attempts", -3),
        ("max_attempts", 32_768),
        ("max_attempts", True),
        ("max_attempts", 1.5),
        ("queue", ""),
        ("queue", "   "),
        ("queue", "q" * 129),
        ("queue", 7),
        ("tags", ["t"] * 65),
        ("tags", ["t" * 256]),
        ("tags", [""]),
        ("tags", [1]),
        ("tags", "a-string"),
        ("tags", ["nul\x00"]),
        ("scheduled_at", dt.datetime(2030, 1, 1)),
        ("scheduled_at", "2030-01-01T00:00:00Z"),
        ("scheduled_at", dt.date(2030, 1, 1)),
        ("metadata", ["not", "a", "dict"]),
        ("metadata", "{}"),
        ("metadata", {"score": math.nan}),
        ("metadata", {"nested": {"score": math.inf}}),
        ("metadata", {1: "int key"}),
        ("metadata", {"text": "nul\x00"}),
        ("metadata", {"at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}),
    ],
    ids=lambda value: repr(value)[:24],
)
def test_a_bad_insert_option_is_refused_naming_the_option(option: str, value: Any) -> None:
    with pytest.raises(InvalidOptionsError) as exc:
        InsertOpts(**{option: value})

    assert exc.value.option == option
    assert str(exc.value).startswith(f"{option}: ")
    assert isinstance(exc.value, SaJobsError)
    assert isinstance(exc.value, ValueError)


def test_a_naive_scheduled_at_says_to_pass_an_aware_datetime() -> None:
    with pytest.raises(InvalidOptionsError, match="naive; pass a time-zone-aware datetime"):
        InsertOpts(scheduled_at=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("option", "value"),
    [("queue", "nul\x00queue"), ("queue", "surrogate\ud800"), ("tags", ["surrogate\udc00"])],
    ids=["queue-nul", "queue-surrogate", "tag-surrogate"],
)
def test_an_option_string_the_database_cannot_store_is_refused_up_front(
    option: str, value: Any
) -> None:
    # Otherwise PostgreSQL rejects the insert's jsonb parameter (a DataError).
    with pytest.raises(InvalidOptionsError) as exc:
        InsertOpts(**{option: value})
    assert exc.value.option == option


def test_the_edges_of_every_insert_option_are_accepted() -> None:
    scheduled = dt.datetime(2030, 1, 1, 9, tzinfo=ZoneInfo("Asia/Tokyo"))
    opts = InsertOpts(
        queue="q" * 128,
        priority=4,
        max_attempts=32_767,
        tags=["t" * 255] * 64,
        metadata={"nested": {"list": [1, 2.5, None, True, "x"]}},
        scheduled_at=scheduled,
    )

    assert opts.tags == ("t" * 255,) * 64
    assert InsertOpts(priority=1, max_attempts=1).priority == 1
    assert opts.scheduled_at == scheduled


def test_library_defaults_apply_when_nobody_sets_anything() -> None:
    assert InsertOpts().resolve(KindDefaults()) == ResolvedInsert(
        queue="default",
        priority=1,
        max_attempts=25,
        tags=(),
        metadata={},
        scheduled_at=None,
    )


def test_kind_defaults_override_library_defaults() -> None:
    declared = KindDefaults(queue="mail", priority=3, max_attempts=5, tags=("email",))

    resolved = InsertOpts().resolve(declared)

    assert (resolved.queue, resolved.priority, resolved.max_attempts, resolved.tags) == (
        "mail",
        3,
        5,
        ("email",),
    )


def test_the_call_site_overrides_kind_defaults_even_with_library_default_values() -> None:
    declared = KindDefaults(queue="mail", priority=3, max_attempts=5, tags=("email",))
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

    resolved = InsertOpts(
        queue="default",
        priority=1,
        max_attempts=25,
        tags=["urgent"],
        metadata={"by": "me"},
        scheduled_at=at,
    ).resolve(declared)

    assert resolved == ResolvedInsert(
        queue="default",
        priority=1,
        max_attempts=25,
        tags=("urgent",),
        metadata={"by": "me"},
        scheduled_at=at,
    )


def test_each_option_falls_back_on_its_own() -> None:
    declared = KindDefaults(priority=2)

    resolved = InsertOpts(queue="reports").resolve(declared)

    assert (resolved.queue, resolved.priority, resolved.max_attempts) == ("reports", 2, 25)


def test_an_explicit_empty_tag_list_at_the_call_site_clears_the_kinds_tags() -> None:
    resolved = InsertOpts(tags=[]).resolve(KindDefaults(tags=("email",)))
    assert resolved.tags == ()


def test_a_declared_classes_defaults_feed_resolution() -> None:
    registry = sa_jobs.KindRegistry()
    cls: type[Any] = sa_jobs.job_args(kind="nightly", registry=registry, queue="batch", priority=4)(
        type("Nightly", (), {})
    )

    resolved = InsertOpts(priority=2).resolve(kind_of(cls).defaults)

    assert (resolved.queue, resolved.priority, resolved.max_attempts) == ("batch", 2, 25)


def test_resolved_metadata_is_a_copy_of_the_callers_dict() -> None:
    metadata = {"k": "v"}
    resolved = InsertOpts(metadata=metadata).resolve(KindDefaults())

    resolved.metadata["k"] = "changed"

    assert metadata == {"k": "v"}
