"""Args that would not read back as given are refused at insert, naming what is wrong.

attrs does not check types, and the worker's decode (cattrs) is lenient: ``str(123)``
and ``int("12")`` succeed, ``int("abc")`` fails. Each wrong-typed value here used to be
stored and then either fail every attempt or reach the handler changed; now encoding
refuses it with the kind, the field's path, the value and the declared type. Values of
the declared type (and an int where a float is declared) still go through.

No database here; every insert path goes through the encoding tested here, and
``tests/integration/test_wrong_typed_inserts.py`` drives the paths themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Any, Literal

import attrs
import pydantic
import pytest

import sa_jobs
from sa_jobs._base.jsonvalue import dumps
from sa_jobs._declare.args import kind_of
from sa_jobs._insert.rows import build_rows, row_of_job
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidJobArgsError
from tests.doc_recipes import load_recipe

REGISTRY = sa_jobs.KindRegistry()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1


class Plan(enum.StrEnum):
    PRO = "pro"


@attrs.frozen
class Address:
    street: str
    number: int = 1


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@sa_jobs.job_args(kind="check.send_email", registry=REGISTRY)
class SendEmail:
    to: str
    template: str = "welcome"


@sa_jobs.job_args(kind="check.everything", registry=REGISTRY)
class Everything:
    text: str = ""
    count: int = 0
    ratio: float = 0.0
    flag: bool = False
    maybe: int | None = None
    either: int | str = 0
    when: dt.datetime | None = None
    day: dt.date | None = None
    color: Color = Color.RED
    amount: Decimal = Decimal(0)
    ident: uuid.UUID | None = None
    numbers: list[int] = attrs.field(factory=list)
    pair: tuple[int, str] = (0, "")
    names: frozenset[str] = frozenset()
    counts: dict[str, int] = attrs.field(factory=dict)
    address: Address | None = None
    lines: list[Line] = attrs.field(factory=list)
    by_name: dict[str, Address] = attrs.field(factory=dict)
    mode: Literal["a", "b"] = "a"
    free: Any = None
    free_dict: dict[str, Any] = attrs.field(factory=dict)


def refusal(args: object) -> str:
    with pytest.raises(InvalidJobArgsError) as caught:
        kind_of(args).encode(args)
    return str(caught.value)


# --------------------------------------------------------------------------- refused


def test_the_issues_example_names_the_kind_the_field_the_value_and_the_type() -> None:
    message = refusal(SendEmail(to=123))  # type: ignore[arg-type]

    assert message == (
        "kind 'check.send_email': SendEmail.to holds 123 (int), but it is declared str: the "
        "worker would read it back as '123', not as given; pass a value of type str (or "
        "change the field's annotation)"
    )


@pytest.mark.parametrize(
    ("changes", "where", "shown", "declared", "outcome"),
    [
        ({"count": "abc"}, "Everything.count", "'abc' (str)", "int", "could not read it back"),
        ({"count": "12"}, "Everything.count", "'12' (str)", "int", "back as 12,"),
        ({"count": 1.5}, "Everything.count", "1.5 (float)", "int", "back as 1,"),
        ({"count": True}, "Everything.count", "True (bool)", "int", "back as 1,"),
        ({"ratio": True}, "Everything.ratio", "True (bool)", "float", "back as 1.0,"),
        ({"flag": 1}, "Everything.flag", "1 (int)", "bool", "back as True,"),
        ({"flag": "no"}, "Everything.flag", "'no' (str)", "bool", "back as True,"),
        ({"text": None}, "Everything.text", "None (NoneType)", "str", "back as 'None',"),
        ({"maybe": "x"}, "Everything.maybe", "'x' (str)", "int | None", "could not read"),
        ({"either": 1.5}, "Everything.either", "1.5 (float)", "int | str", "could not read"),
        (
            {"when": "2024-01-01T00:00:00+00:00"},
            "Everything.when",
            "'2024-01-01T00:00:00+00:00' (str)",
            "datetime | None",
            "cannot be written as one",
        ),
        (
            {"day": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)},
            "Everything.day",
            "(datetime)",
            "date | None",
            "could not read it back",
        ),
        ({"color": "red"}, "Everything.color", "'red' (str)", "Color", "cannot be written"),
        ({"ratio": Decimal("1.5")}, "Everything.ratio", "Decimal('1.5') (Decimal)", "float", ""),
        ({"numbers": [1, "2"]}, "Everything.numbers[1]", "'2' (str)", "int", "back as 2,"),
        ({"pair": (1, 2)}, "Everything.pair[1]", "2 (int)", "str", "back as '2',"),
        ({"counts": {"a": "1"}}, "Everything.counts['a']", "'1' (str)", "int", "back as 1,"),
        (
            {"address": Address(street=5)},  # type: ignore[arg-type]
            "Everything.address.street",
            "5 (int)",
            "str",
            "back as '5',",
        ),
        (
            {"lines": [Line("a", 1), Line("b", "two")]},  # type: ignore[arg-type]
            "Everything.lines[1].quantity",
            "'two' (str)",
            "int",
            "could not read it back",
        ),
        (
            {"by_name": {"home": Address("x", number=2.5)}},  # type: ignore[arg-type]
            "Everything.by_name['home'].number",
            "2.5 (float)",
            "int",
            "back as 2,",
        ),
        ({"mode": "c"}, "Everything.mode", "'c' (str)", "Literal['a', 'b']", "could not read"),
    ],
    ids=lambda value: None,
)
def test_a_wrong_typed_value_is_refused_with_its_path_value_and_declared_type(
    changes: dict[str, Any], where: str, shown: str, declared: str, outcome: str
) -> None:
    message = refusal(attrs.evolve(Everything(), **changes))

    assert message.startswith(f"kind 'check.everything': {where} holds ")
    assert shown in message
    assert f"declared {declared}" in message
    assert outcome in message
    assert f"pass a value of type {declared}" in message


def test_a_wrong_typed_element_of_a_set_is_refused() -> None:
    message = refusal(Everything(names=frozenset({"a", 1})))  # type: ignore[arg-type]
    assert "Everything.names (an element) holds 1 (int), but it is declared str" in message


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    "changes",
    [
        {"ratio": 1},  # an int where a float is declared, as type checkers allow
        {"count": 1.0},  # the same JSON number: the worker reads back 1
        {"count": Level.LOW},  # an IntEnum is an int
        {"text": Plan.PRO},  # a StrEnum is a str
        {"maybe": None},
        {"either": "x"},
        {"either": 3},
        {"names": frozenset({"b", "a"})},
        {"when": dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))},
        {"day": dt.date(2024, 2, 29)},
        {"ident": uuid.UUID(int=7)},
        {"amount": Decimal("1.50")},
        {"address": Address("x")},
        {"lines": [Line("a", 1)]},
        {"mode": "b"},
        {"free": {"anything": [1, "two", None, 3.5, {"x": True}]}},
    ],
    ids=lambda changes: ",".join(changes),
)
def test_a_value_of_the_declared_type_goes_through(changes: dict[str, Any]) -> None:
    args = attrs.evolve(Everything(), **changes)
    stored = json.loads(dumps(kind_of(args).encode(args)))

    assert kind_of(args).decode(stored) == args


def test_what_the_converter_writes_in_the_declared_form_reads_back_as_the_declared_type() -> None:
    # The check compares JSON: these are written just as a value of the declared type
    # would be, and the worker reads them back as that type.
    args = Everything(numbers=(1, 2), amount=1.5, free_dict={"k": (1, 2)})  # type: ignore[arg-type]
    stored = json.loads(dumps(kind_of(args).encode(args)))

    back = kind_of(args).decode(stored)
    assert (back.numbers, back.amount, back.free_dict) == ([1, 2], Decimal("1.5"), {"k": [1, 2]})


# --------------------------------------------------------------------------- dict keys


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"free": {(1, 2): "x"}}, "Everything.free"),
        ({"free_dict": {"outer": {(1, 2): "x"}}}, "Everything.free_dict['outer']"),
        ({"free": [{"ok": 1}, {(3, 4): 2}]}, "Everything.free[1]"),
    ],
    ids=["any", "nested-any", "in-a-list"],
)
def test_a_tuple_dict_key_says_json_object_keys_must_be_strings(
    changes: dict[str, Any], where: str
) -> None:
    message = refusal(attrs.evolve(Everything(), **changes))

    assert "unhashable" not in message
    assert f"{where} holds a dict key (" in message
    assert "JSON object keys must be strings" in message


def test_an_int_dict_key_names_its_field_too() -> None:
    message = refusal(Everything(counts={1: 2}))  # type: ignore[dict-item]
    assert "Everything.counts holds a dict key 1 (int); JSON object keys must be strings" in (
        message
    )


# --------------------------------------------------------------------------- other converters


@attrs.frozen
class Money:
    cents: int
    currency: str


def money_converter(*, lossy: bool) -> sa_jobs.ArgsConverter:
    conv = sa_jobs.ArgsConverter()
    conv.cattrs.register_unstructure_hook(Money, lambda m: f"{m.cents} {m.currency}")

    def structure(text: str, _: type) -> Money:
        cents, currency = text.split()
        return Money(int(cents), currency.upper() if lossy else currency)

    conv.cattrs.register_structure_hook(Money, structure)
    return conv


def test_a_custom_converters_hooks_are_what_reads_back() -> None:
    @sa_jobs.job_args(
        kind="check.charge", registry=REGISTRY, converter=money_converter(lossy=False)
    )
    class Charge:
        amount: Money

    assert kind_of(Charge).encode(Charge(Money(5, "eur"))) == {"amount": "5 eur"}

    @sa_jobs.job_args(
        kind="check.charge2", registry=REGISTRY, converter=money_converter(lossy=True)
    )
    class LossyCharge:
        amount: Money

    message = refusal(LossyCharge(Money(5, "eur")))
    assert "LossyCharge.amount holds Money(cents=5, currency='eur') (Money)" in message
    assert "read back as '5 EUR'" in message
    assert "its type's hooks on the kind's converter" in message


def test_a_pydantic_model_validates_itself_and_a_bypassed_one_is_refused() -> None:
    recipe = load_recipe("job-args.md", "Pydantic models")
    good = recipe.GeocodeAddress(1, recipe.ShippingAddress(street="1 Main St", city="Lyon"))
    assert kind_of(good).encode(good)["address"]["city"] == "Lyon"

    with pytest.raises(pydantic.ValidationError):
        recipe.ShippingAddress(street="x", city=5)
    # model_construct skips pydantic's validation; the worker's model_validate would not.
    unchecked = recipe.ShippingAddress.model_construct(street="x", city=None)
    message = refusal(recipe.GeocodeAddress(1, unchecked))
    assert "GeocodeAddress.address" in message
    assert "which the worker could not read back" in message
    assert "city" in message and "valid string" in message


def test_a_list_payload_kind_checks_its_elements() -> None:
    @sa_jobs.job_args(kind="check.batch", registry=REGISTRY, list_payload=True)
    class Batch:
        ids: list[int]

    assert kind_of(Batch).encode(Batch([1, 2])) == [1, 2]
    assert "Batch.ids[1] holds 'x' (str), but it is declared int" in refusal(Batch([1, "x"]))  # type: ignore[list-item]


# --------------------------------------------------------------------------- every path


def test_a_batch_with_one_wrong_typed_item_fails_before_any_row_is_handed_out() -> None:
    consumed: list[int] = []

    def items() -> Any:
        for index, args in enumerate([SendEmail("a"), SendEmail(7), SendEmail("b")]):  # type: ignore[arg-type]
            consumed.append(index)
            yield args, sa_jobs.InsertOpts()

    with pytest.raises(InvalidJobArgsError, match=r"SendEmail\.to holds 7 \(int\)"):
        build_rows(items())
    assert consumed == [0, 1]


def test_a_hand_built_job_of_a_known_kind_must_read_back_too() -> None:
    @sa_jobs.job_args(kind="check.hand_built")
    class HandBuilt:
        n: int

    assert row_of_job(Job(kind="check.hand_built", args_json={"n": 3}))["args"] == {"n": 3}
    with pytest.raises(InvalidJobArgsError, match=r"HandBuilt\.n holds 'x' \(str\)"):
        row_of_job(Job(kind="check.hand_built", args_json={"n": "x"}))
    with pytest.raises(InvalidJobArgsError, match=r"HandBuilt\.n holds True \(bool\)"):
        row_of_job(Job(kind="check.hand_built", args_json={"n": True}))
    # A kind this process does not know is another service's business.
    assert row_of_job(Job(kind="check.elsewhere", args_json={"n": "x"}))["args"] == {"n": "x"}


def test_a_periodic_job_with_wrong_typed_args_fails_where_it_is_built() -> None:
    @sa_jobs.job_args(kind="check.periodic")
    class Report:
        day: int = 0

    with pytest.raises(InvalidJobArgsError, match=r"Report\.day holds 'monday' \(str\)"):
        sa_jobs.PeriodicJob("0 9 * * *", Report(day="monday"), name="report")  # type: ignore[arg-type]
    factory = sa_jobs.PeriodicJob("0 9 * * *", lambda: Report(day="monday"), name="r2")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobArgsError, match=r"Report\.day holds 'monday'"):
        factory.build_args()


# --------------------------------------------------------------------------- numbers


def test_numbers_compare_as_the_json_numbers_jsonb_keeps() -> None:
    # 3.423166889590815e+16 is stored as the numeric 34231668895908150, which an int
    # field reads back as exactly that: the same number.
    as_int = Everything(count=3.423166889590815e16)  # type: ignore[arg-type]
    assert kind_of(as_int).encode(as_int)["count"] == 3.423166889590815e16
    assert kind_of(Everything).encode(Everything(ratio=10**16))["ratio"] == 10**16
    # 2**53 + 1 has no float: a float field would read back 9007199254740992.0.
    message = refusal(Everything(ratio=2**53 + 1))
    assert "Everything.ratio holds 9007199254740993 (int)" in message
    assert "read back as 9007199254740992.0: no float holds that integer exactly" in message
