"""Dataclasses as job args: declared as they are, converted like attrs classes.

``@job_args`` keeps a dataclass a dataclass (its ``eq``, ``frozen`` and ``slots`` are its
author's) and only attaches the kind. No database here: "stored" JSON is what the
converter produced, through ``json.dumps``/``json.loads`` as every insert path sends it;
``tests/integration/test_args_classes_roundtrip.py`` takes the same classes through
PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sa_jobs
from sa_jobs._base.jsonvalue import dumps
from sa_jobs._declare.args import kind_of
from sa_jobs.errors import InvalidJobArgsError
from sa_jobs.testing import aware_datetimes, storable_text
from tests.args_compare import comparable
from tests.doc_recipes import load_recipe
from tests.unit import future_annotated_dataclasses

REGISTRY = sa_jobs.KindRegistry()


class Tier(enum.StrEnum):
    FREE = "free"
    PRO = "pro"


@dataclasses.dataclass(frozen=True)
class Address:
    street: str
    moved_in: dt.date | None = None


@attrs.frozen
class Contact:
    email: str
    verified_at: dt.datetime | None = None


@dataclasses.dataclass
class ByPost:
    street: str


@dataclasses.dataclass
class ByMail:
    email: str
    bounced: bool = False


@sa_jobs.job_args(kind="test_args_dataclasses.frozen", registry=REGISTRY)
@dataclasses.dataclass(frozen=True)
class Welcome:
    user_id: int
    at: dt.datetime
    tier: Tier = Tier.FREE
    amount: Decimal = Decimal("0.00")
    ident: uuid.UUID | None = None
    tags: list[str] = dataclasses.field(default_factory=list)


@sa_jobs.job_args(kind="test_args_dataclasses.mutable", registry=REGISTRY)
@dataclasses.dataclass
class Draft:
    body: str = ""
    revisions: int = 0


@sa_jobs.job_args(kind="test_args_dataclasses.slots", registry=REGISTRY)
@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    n: int
    label: str = "x"


@sa_jobs.job_args(kind="test_args_dataclasses.nested", registry=REGISTRY)
@dataclasses.dataclass(frozen=True)
class Customer:
    name: str
    address: Address
    contact: Contact
    previous: tuple[Address, ...] = ()
    by_label: dict[str, Address] = dataclasses.field(default_factory=dict)
    maybe_address: Address | None = None
    reach: ByPost | ByMail | None = None


@sa_jobs.job_args(kind="test_args_dataclasses.in_attrs", registry=REGISTRY)
class Shipment:
    """A plain class (made attrs) holding dataclasses."""

    to: Address
    stops: list[Address] = attrs.Factory(list)


def stored(args: object) -> Any:
    """The JSON an insert would send for ``args``, as the database hands it back."""
    return json.loads(dumps(kind_of(args).encode(args)))


def roundtrip(args: object) -> Any:
    return kind_of(args).decode(stored(args))


UTC_NOON = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- declaring


def test_a_frozen_dataclass_stays_a_frozen_dataclass_with_its_own_eq_and_hash() -> None:
    args = Welcome(7, UTC_NOON)

    assert dataclasses.is_dataclass(Welcome)
    assert not attrs.has(Welcome), "job_args must not turn a dataclass into an attrs class"
    assert kind_of(args).name == "test_args_dataclasses.frozen"
    assert args == Welcome(user_id=7, at=UTC_NOON)
    assert args != Welcome(8, UTC_NOON)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.user_id = 8  # type: ignore[misc]
    assert dataclasses.replace(args, user_id=9).user_id == 9
    assert [f.name for f in dataclasses.fields(args)] == [
        "user_id",
        "at",
        "tier",
        "amount",
        "ident",
        "tags",
    ], "the kind must not show up as a field"


def test_a_frozen_dataclass_without_mutable_fields_hashes_by_value() -> None:
    assert hash(Slotted(1)) == hash(Slotted(1))
    assert {Slotted(1), Slotted(1), Slotted(2)} == {Slotted(1), Slotted(2)}


def test_a_mutable_dataclass_stays_mutable() -> None:
    draft = Draft()
    draft.body = "edited"
    draft.revisions += 1

    assert draft == Draft("edited", 1)
    assert roundtrip(draft) == Draft("edited", 1)


def test_a_slots_dataclass_keeps_its_slots_and_gets_its_kind() -> None:
    args = Slotted(3)

    assert "__slots__" in Slotted.__dict__
    assert not hasattr(args, "__dict__"), "slots=True must still mean no instance dict"
    assert kind_of(args).name == "test_args_dataclasses.slots"
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.n = 4  # type: ignore[misc]
    assert roundtrip(args) == args


def test_frozen_false_for_a_mutable_dataclass_is_accepted_for_type_checkers() -> None:
    @dataclasses.dataclass
    class Loose:
        n: int

    declared = sa_jobs.job_args(kind="loose", registry=sa_jobs.KindRegistry(), frozen=False)(Loose)

    assert declared is Loose
    loose = Loose(1)
    loose.n = 2
    assert loose.n == 2


def test_frozen_that_disagrees_with_the_dataclass_is_refused() -> None:
    @dataclasses.dataclass
    class Loose:
        n: int

    with pytest.raises(InvalidJobArgsError, match=r"disagrees with .*Loose.*not frozen"):
        sa_jobs.job_args(kind="loose", registry=sa_jobs.KindRegistry(), frozen=True)(Loose)


def test_frozen_that_disagrees_with_the_attrs_class_is_refused_too() -> None:
    @attrs.frozen
    class Fixed:
        n: int

    with pytest.raises(InvalidJobArgsError, match=r"disagrees with .*Fixed.*and frozen"):
        sa_jobs.job_args(kind="fixed", registry=sa_jobs.KindRegistry(), frozen=False)(Fixed)


def test_sa_jobs_field_in_a_dataclass_is_refused_not_made_a_default() -> None:
    with pytest.raises(
        InvalidJobArgsError, match=r"Keyed.account_id is a sa_jobs.field.*needs an attrs class"
    ):

        @sa_jobs.job_args(kind="keyed", registry=sa_jobs.KindRegistry())
        @dataclasses.dataclass
        class Keyed:
            account_id: int = sa_jobs.field(unique=True)


def test_a_key_mark_in_dataclass_field_metadata_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidJobArgsError, match=r"Keyed.account_id carries sa_jobs' 'sa_jobs'"):

        @sa_jobs.job_args(kind="keyed", registry=sa_jobs.KindRegistry())
        @dataclasses.dataclass
        class Keyed:
            account_id: int = dataclasses.field(metadata={"sa_jobs": {"unique": True}})


def test_a_subclass_of_a_dataclass_must_be_a_dataclass_itself() -> None:
    @dataclasses.dataclass
    class Base:
        n: int

    class Child(Base):
        extra: str = ""

    with pytest.raises(InvalidJobArgsError, match="decorate it with @dataclass too"):
        sa_jobs.job_args(kind="child", registry=sa_jobs.KindRegistry())(Child)


def test_a_dataclass_field_that_could_not_be_read_back_is_refused_at_declaration() -> None:
    with pytest.raises(InvalidJobArgsError, match=r"Ambiguous.when is the union str \| datetime"):

        @sa_jobs.job_args(kind="ambiguous", registry=sa_jobs.KindRegistry())
        @dataclasses.dataclass
        class Ambiguous:
            when: str | dt.datetime


@dataclasses.dataclass
class Left:
    x: int


@dataclasses.dataclass
class Right:
    x: int


def test_two_dataclasses_nothing_tells_apart_are_refused_in_a_union() -> None:
    # Module-level classes: string annotations naming a function's locals would postpone
    # the check to the first use.
    with pytest.raises(InvalidJobArgsError, match="cannot read back"):

        @sa_jobs.job_args(kind="twins", registry=sa_jobs.KindRegistry())
        @dataclasses.dataclass
        class Twins:
            side: Left | Right


def test_a_list_payload_dataclass_stores_its_list() -> None:
    @sa_jobs.job_args(kind="batch", registry=sa_jobs.KindRegistry(), list_payload=True)
    @dataclasses.dataclass(frozen=True)
    class Batch:
        ids: list[int]

    assert stored(Batch([1, 2])) == [1, 2]
    assert roundtrip(Batch([1, 2])) == Batch([1, 2])


def test_a_list_payload_dataclass_with_two_fields_is_refused() -> None:
    with pytest.raises(InvalidJobArgsError, match="exactly one field"):

        @sa_jobs.job_args(kind="batch2", registry=sa_jobs.KindRegistry(), list_payload=True)
        @dataclasses.dataclass
        class Batch:
            ids: list[int]
            more: int = 0


# --------------------------------------------------------------------------- converting


def test_a_dataclass_is_stored_as_an_object_of_its_fields() -> None:
    args = Welcome(7, UTC_NOON, Tier.PRO, Decimal("9.90"), uuid.UUID(int=1), ["a"])

    assert stored(args) == {
        "user_id": 7,
        "at": "2024-05-01T12:00:00+00:00",
        "tier": "pro",
        "amount": "9.90",
        "ident": "00000000-0000-0000-0000-000000000001",
        "tags": ["a"],
    }
    assert roundtrip(args) == args


def test_defaults_fill_what_an_older_job_did_not_store() -> None:
    assert kind_of(Welcome).decode({"user_id": 1, "at": "2024-05-01T12:00:00+00:00"}) == (
        Welcome(1, UTC_NOON)
    )


def test_nested_dataclasses_and_attrs_classes_round_trip_both_ways() -> None:
    customer = Customer(
        name="Ada",
        address=Address("1 Main St", dt.date(2020, 1, 2)),
        contact=Contact("ada@example.com", UTC_NOON),
        previous=(Address("2 Side St"),),
        by_label={"work": Address("3 Office Rd")},
        maybe_address=None,
        reach=ByMail("ada@example.com", bounced=True),
    )
    shipment = Shipment(Address("4 Dock"), [Address("5 Stop")])

    assert roundtrip(customer) == customer
    assert type(roundtrip(customer).reach) is ByMail
    assert roundtrip(dataclasses.replace(customer, reach=ByPost("x"))).reach == ByPost("x")
    assert roundtrip(shipment) == shipment


def test_a_naive_datetime_inside_a_dataclass_is_refused_before_anything_is_written() -> None:
    with pytest.raises(InvalidJobArgsError, match="naive datetime"):
        kind_of(Welcome).encode(Welcome(1, dt.datetime(2024, 1, 1)))


def test_stored_json_that_no_longer_fits_names_the_dataclass_and_the_field() -> None:
    with pytest.raises(InvalidJobArgsError, match=r"Welcome.*user_id"):
        kind_of(Welcome).decode({"at": "2024-05-01T12:00:00+00:00"})


def test_string_annotations_of_a_dataclass_resolve_even_forward_ones() -> None:
    order = future_annotated_dataclasses.Order(
        Decimal("12.50"), [future_annotated_dataclasses.OrderLine("tea", UTC_NOON)]
    )

    assert roundtrip(order) == order
    assert type(roundtrip(order).lines[0]) is future_annotated_dataclasses.OrderLine


addresses = st.builds(Address, storable_text(), st.none() | st.dates())
contacts = st.builds(Contact, storable_text(), st.none() | aware_datetimes())


@given(
    st.builds(
        Customer,
        name=storable_text(),
        address=addresses,
        contact=contacts,
        previous=st.lists(addresses, max_size=3).map(tuple),
        by_label=st.dictionaries(storable_text(), addresses, max_size=3),
        maybe_address=st.none() | addresses,
        reach=st.none()
        | st.builds(ByPost, storable_text())
        | st.builds(ByMail, storable_text(), st.booleans()),
    )
)
def test_any_storable_nested_dataclass_args_come_back_equal(customer: Customer) -> None:
    # Wall time and offset, not ==: a zone's fold time compares unequal to its offset,
    # and comparable() checks every nested value's type too.
    assert comparable(roundtrip(customer)) == comparable(customer)


def test_the_classes_in_the_docs_declare_and_round_trip_as_the_docs_say() -> None:
    docs = load_recipe("job-args.md", "Classes you already have")

    assert attrs.has(docs.Welcome) and attrs.has(docs.Resize)
    assert dataclasses.is_dataclass(docs.SendInvoice) and not attrs.has(docs.SendInvoice)
    invoice = docs.SendInvoice(1, dt.date(2024, 1, 31), [docs.InvoiceLine("tea", 350)])
    assert roundtrip(invoice) == invoice
    draft = docs.EditDraft(1)
    draft.body = "edited"
    assert roundtrip(draft) == docs.EditDraft(1, "edited")
    assert kind_of(docs.Welcome(1)).name == "welcome"
