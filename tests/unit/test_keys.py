"""Unique keys: the canonical bytes, byte for byte, and their independence from the host.

The format is documented in ``sa_jobs/_declare/unique_sequence_keys.py`` and
``docs/unique-jobs.md``; these tests
hold the code to it. Keys are computed through ``sa_jobs.testing.canonical_unique_key``,
which resolves options exactly as an insert does (call site, then the kind's defaults).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sa_jobs
from sa_jobs import JobState, UniqueOpts
from sa_jobs._declare.args import KindRegistry
from sa_jobs._declare.options import DEFAULT_UNIQUE_STATES, REQUIRED_UNIQUE_STATES
from sa_jobs._declare.unique_sequence_keys import canonical_args, period_start_us
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.testing import (
    args_values,
    canonical_unique_key,
    incomplete_unique_states,
    unique_key,
    unique_opts,
    unique_states,
)

REPO = Path(__file__).resolve().parents[2]

# A registry of our own: these kinds cannot clash with any other test's.
registry = KindRegistry()

BY_ARGS = UniqueOpts(by_args=True)
QUARTER_HOUR = dt.timedelta(minutes=15)
#: The seed's example: 15:21 falls in the bucket 15:15-15:30.
AT_15_21 = dt.datetime(2026, 11, 22, 15, 21, tzinfo=dt.UTC)
BUCKET_15_15_US = 1_795_360_500_000_000


@sa_jobs.job_args(kind="reconcile_account", registry=registry)
class ReconcileAccount:
    account_id: int


@sa_jobs.job_args(kind="test_keys.plain", registry=registry)
class Plain:
    n: int = 0


@sa_jobs.job_args(kind="test_keys.plain_twin", registry=registry)
class PlainTwin:
    n: int = 0


@attrs.frozen
class Inner:
    z: int
    a: int


@sa_jobs.job_args(kind="test_keys.unordered", registry=registry)
class Unordered:
    # Declared out of alphabetical order, with nested values out of order too.
    zulu: str
    alpha: int
    inner: Inner
    mapping: dict[str, int]
    tags: frozenset[str] = frozenset()


@attrs.frozen
class Customer:
    id: int = sa_jobs.field(unique=True)
    name: str = ""


@attrs.frozen
class Address:
    street: str
    city: str


@attrs.frozen
class Note:
    text: str


@sa_jobs.job_args(kind="test_keys.subset", registry=registry)
class Subset:
    account: int = sa_jobs.field(unique=True)
    trace_id: str = ""
    customer: Customer = Customer(0)  # nested attrs class that marks a field of its own
    address: Address = sa_jobs.field(default=Address("", ""), unique=True)  # kept whole
    note: Note = Note("")  # nested, marks nothing: left out


@sa_jobs.job_args(
    kind="test_keys.kind_default",
    queue="mail",
    unique=UniqueOpts(by_args=True, by_queue=True),
    registry=registry,
)
class WithKindDefault:
    to: str


def key_bytes(args: object, **options: Any) -> bytes:
    canonical = canonical_unique_key(args, **options)
    assert canonical is not None, "expected a unique job"
    return canonical


# ------------------------------------------------------------------ byte for byte


def test_kind_only() -> None:
    # Not empty (a TTL, or an explicit by_state) but no dimension: unique by kind alone.
    expected = b'sa_jobs:unique:v1\nkind="test_keys.plain"'
    assert key_bytes(Plain(1), unique=UniqueOpts(ttl=dt.timedelta(hours=1))) == expected
    assert key_bytes(Plain(2), unique=UniqueOpts(by_state=REQUIRED_UNIQUE_STATES)) == expected


def test_the_documented_example_hashes_to_the_documented_digest() -> None:
    opts = UniqueOpts(by_args=True, by_period=QUARTER_HOUR, by_queue=True)
    canonical = key_bytes(ReconcileAccount(1), unique=opts, now=AT_15_21)
    assert canonical == (
        b"sa_jobs:unique:v1\n"
        b'kind="reconcile_account"\n'
        b'args={"account_id":1}\n'
        b"period=1795360500000000\n"
        b'queue="default"'
    )
    digest = unique_key(ReconcileAccount(1), unique=opts, now=AT_15_21)
    assert digest == hashlib.sha256(canonical).digest()
    assert digest is not None
    assert digest.hex().startswith("3b321f48")
    assert digest.hex().endswith("7c72c9aea")


def test_by_args_sorts_top_level_keys_and_keeps_nested_order() -> None:
    args = Unordered(
        zulu="é\n", alpha=1, inner=Inner(z=1, a=2), mapping={"b": 1, "a": 2}, tags={"y", "x"}
    )
    assert key_bytes(args, unique=BY_ARGS) == (
        b'sa_jobs:unique:v1\nkind="test_keys.unordered"\n'
        b'args={"alpha":1,"inner":{"z":1,"a":2},"mapping":{"b":1,"a":2},'
        b'"tags":["x","y"],"zulu":"\xc3\xa9\\n"}'
    )


def test_top_level_key_order_of_the_stored_object_does_not_matter() -> None:
    # A hand-built Job carries args_json as given: its top-level order is irrelevant...
    forwards = {"alpha": 1, "zulu": "z", "mapping": {"b": 1, "a": 2}}
    backwards = {"mapping": {"b": 1, "a": 2}, "zulu": "z", "alpha": 1}
    assert canonical_args(Unordered, forwards, "unique") == canonical_args(
        Unordered, backwards, "unique"
    )
    # ...but nested objects keep their order (River sorts the top level only).
    nested_swapped = {"alpha": 1, "zulu": "z", "mapping": {"a": 2, "b": 1}}
    assert canonical_args(Unordered, forwards, "unique") != canonical_args(
        Unordered, nested_swapped, "unique"
    )


#: Any value the stored args JSON can hold (finite floats: the converter refuses the rest).
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), JSON_VALUES, max_size=6))
def test_the_args_line_is_the_documented_json_of_any_object(data: dict[str, Any]) -> None:
    # The key is built with shortcuts for common scalars; it must still be exactly the
    # encoding docs/unique-jobs.md documents: compact, non-ASCII kept, top level sorted.
    documented = json.dumps(
        {key: data[key] for key in sorted(data)},
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    assert canonical_args(Plain, data, "unique") == documented


def test_subset_of_marked_fields_including_nested_attrs_fields() -> None:
    args = Subset(
        account=7,
        trace_id="trace-1",
        customer=Customer(id=3, name="Ada"),
        address=Address(street="1 Main St", city="Oslo"),
        note=Note("ignored"),
    )
    assert key_bytes(args, unique=BY_ARGS) == (
        b'sa_jobs:unique:v1\nkind="test_keys.subset"\n'
        b'args={"account":7,"address":{"street":"1 Main St","city":"Oslo"},"customer":{"id":3}}'
    )
    # Unmarked fields (top level and nested) do not change the key; marked ones do.
    same = attrs.evolve(args, trace_id="trace-2", customer=Customer(3, "Bob"), note=Note("x"))
    assert unique_key(same, unique=BY_ARGS) == unique_key(args, unique=BY_ARGS)
    for different in (
        attrs.evolve(args, account=8),
        attrs.evolve(args, customer=Customer(4, "Ada")),
        attrs.evolve(args, address=Address("1 Main St", "Bergen")),
    ):
        assert unique_key(different, unique=BY_ARGS) != unique_key(args, unique=BY_ARGS)


def test_by_period_floors_to_the_bucket_from_the_epoch_in_utc() -> None:
    opts = UniqueOpts(by_period=QUARTER_HOUR)
    assert period_start_us(AT_15_21, QUARTER_HOUR) == BUCKET_15_15_US
    assert key_bytes(Plain(), unique=opts, now=AT_15_21) == (
        b'sa_jobs:unique:v1\nkind="test_keys.plain"\nperiod=1795360500000000'
    )

    def key_at(hour: int, minute: int, second: int = 0, micro: int = 0) -> bytes | None:
        at = dt.datetime(2026, 11, 22, hour, minute, second, micro, tzinfo=dt.UTC)
        return unique_key(Plain(), unique=opts, now=at)

    bucket = key_at(15, 21)
    assert key_at(15, 15) == bucket  # the bucket's first instant
    assert key_at(15, 28) == bucket  # the seed: skipped at 15:28
    assert key_at(15, 29, 59, 999_999) == bucket
    assert key_at(15, 30) != bucket
    assert key_at(15, 31) != bucket  # the seed: allowed at 15:31
    assert key_at(15, 14, 59, 999_999) != bucket
    # The same instant written in another zone is the same bucket.
    tokyo = AT_15_21.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert unique_key(Plain(), unique=opts, now=tokyo) == bucket
    # Periods that do not divide a day still count from the epoch, and floor below it.
    assert period_start_us(AT_15_21, dt.timedelta(minutes=7)) % (7 * 60 * 1_000_000) == 0
    before_epoch = dt.datetime(1969, 12, 31, 23, 30, tzinfo=dt.UTC)
    assert period_start_us(before_epoch, dt.timedelta(hours=1)) == -3_600_000_000


def test_by_period_uses_scheduled_at_when_given() -> None:
    opts = UniqueOpts(by_period=dt.timedelta(hours=1))
    scheduled = dt.datetime(2026, 11, 23, 9, 7, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    canonical = key_bytes(Plain(), unique=opts, now=AT_15_21, scheduled_at=scheduled)
    expected_us = int(dt.datetime(2026, 11, 23, 14, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000
    assert canonical.endswith(f"\nperiod={expected_us}".encode())
    # The insert time no longer matters once scheduled_at is given.
    later = AT_15_21 + dt.timedelta(days=3)
    assert canonical == key_bytes(Plain(), unique=opts, now=later, scheduled_at=scheduled)


def test_by_queue_uses_the_resolved_queue() -> None:
    opts = UniqueOpts(by_queue=True)
    assert key_bytes(Plain(), unique=opts, queue="high") == (
        b'sa_jobs:unique:v1\nkind="test_keys.plain"\nqueue="high"'
    )
    assert key_bytes(Plain(), unique=opts).endswith(b'\nqueue="default"')
    # A queue cannot forge a line: JSON escapes the newline.
    assert key_bytes(Plain(), unique=opts, queue="q\nkind=x").endswith(b'\nqueue="q\\nkind=x"')


def test_kind_default_applies_and_the_call_site_overrides_it() -> None:
    assert key_bytes(WithKindDefault("a@example.com")) == (
        b'sa_jobs:unique:v1\nkind="test_keys.kind_default"\n'
        b'args={"to":"a@example.com"}\nqueue="mail"'
    )
    assert key_bytes(WithKindDefault("a"), unique=UniqueOpts(by_args=True)) == (
        b'sa_jobs:unique:v1\nkind="test_keys.kind_default"\nargs={"to":"a"}'
    )
    # UniqueOpts() at the call site turns the kind's uniqueness off.
    assert canonical_unique_key(WithKindDefault("a"), unique=UniqueOpts()) is None


def test_exclude_kind_leaves_the_kind_out_so_kinds_share_keys() -> None:
    opts = UniqueOpts(by_args=True, exclude_kind=True)
    assert key_bytes(Plain(3), unique=opts) == b'sa_jobs:unique:v1\nargs={"n":3}'
    assert unique_key(Plain(3), unique=opts) == unique_key(PlainTwin(3), unique=opts)
    assert unique_key(Plain(3), unique=BY_ARGS) != unique_key(PlainTwin(3), unique=BY_ARGS)
    assert key_bytes(Plain(), unique=UniqueOpts(exclude_kind=True)) == b"sa_jobs:unique:v1"


def test_empty_unique_opts_means_no_key() -> None:
    assert canonical_unique_key(Plain(), unique=UniqueOpts()) is None
    assert canonical_unique_key(Plain()) is None  # no kind default either


def test_state_ttl_and_until_are_not_part_of_the_key() -> None:
    base = unique_key(Plain(1), unique=BY_ARGS)
    for opts in (
        UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES),
        UniqueOpts(by_args=True, ttl=dt.timedelta(seconds=5)),
        UniqueOpts(by_args=True, until="start"),
    ):
        assert unique_key(Plain(1), unique=opts) == base


# ------------------------------------------------------------------ by_state validation


def test_default_states_are_all_but_cancelled_and_discarded() -> None:
    assert UniqueOpts(by_args=True).states == DEFAULT_UNIQUE_STATES
    assert frozenset(JobState) - DEFAULT_UNIQUE_STATES == {JobState.CANCELLED, JobState.DISCARDED}


def _named_as_missing(error: InvalidOptionsError) -> set[str]:
    # "by_state: must include pending, running: sa_jobs cannot resolve ..."
    message = str(error)
    listed = message.split("must include ", 1)[1].split(":", 1)[0]
    return {name.strip() for name in listed.split(",")}


@given(incomplete_unique_states())
def test_by_state_missing_a_required_state_is_refused_naming_it(states: list[JobState]) -> None:
    missing = {state.value for state in REQUIRED_UNIQUE_STATES - set(states)}
    with pytest.raises(InvalidOptionsError) as caught:
        UniqueOpts(by_args=True, by_state=states)
    assert caught.value.option == "by_state"
    assert _named_as_missing(caught.value) == missing
    # As strings, too.
    with pytest.raises(InvalidOptionsError) as caught:
        UniqueOpts(by_state=[state.value for state in states])
    assert _named_as_missing(caught.value) == missing


def test_by_state_without_retryable_is_accepted_and_strings_work() -> None:
    opts = UniqueOpts(by_state=["available", "pending", "running", "scheduled"])
    assert opts.states == REQUIRED_UNIQUE_STATES


@given(unique_states())
def test_every_valid_by_state_is_accepted(states: frozenset[JobState] | None) -> None:
    opts = UniqueOpts(by_state=states)
    assert opts.states >= REQUIRED_UNIQUE_STATES


# ------------------------------------------------------------------ properties


@given(unique_opts(), args_values(Subset), st.sampled_from(["default", "q2"]))
def test_the_lines_follow_the_options(opts: UniqueOpts, args: Subset, queue: str) -> None:
    lines = key_bytes(args, unique=opts, queue=queue, now=AT_15_21).decode().split("\n")
    assert lines[0] == "sa_jobs:unique:v1"
    names = [line.split("=", 1)[0] for line in lines[1:]]
    expected = [
        name
        for name, present in (
            ("kind", not opts.exclude_kind),
            ("args", opts.by_args),
            ("period", opts.by_period is not None),
            ("queue", opts.by_queue),
        )
        if present
    ]
    assert names == expected


@given(args_values(Subset), args_values(Subset))
def test_subset_keys_collide_exactly_when_the_marked_fields_agree(a: Subset, b: Subset) -> None:
    def marked(value: Subset) -> tuple[Any, ...]:
        return (value.account, value.customer.id, value.address)

    assert (unique_key(a, unique=BY_ARGS) == unique_key(b, unique=BY_ARGS)) == (
        marked(a) == marked(b)
    )


# ------------------------------------------------------------------ across processes


EXAMPLE_NOW = dt.datetime(2026, 11, 22, 23, 59, 59, 999_999, tzinfo=dt.UTC)


def example_digests() -> dict[str, str]:
    """Digests of a few keys; computed here and in subprocesses with other zones/seeds."""
    examples: dict[str, tuple[object, dict[str, Any]]] = {
        "documented": (
            ReconcileAccount(1),
            {"unique": UniqueOpts(by_args=True, by_period=QUARTER_HOUR, by_queue=True)},
        ),
        "daily": (Plain(5), {"unique": UniqueOpts(by_args=True, by_period=dt.timedelta(1))}),
        "scheduled": (
            Plain(5),
            {
                "unique": UniqueOpts(by_period=dt.timedelta(hours=1)),
                "scheduled_at": dt.datetime(2030, 1, 1, 8, 30, tzinfo=dt.UTC),
            },
        ),
        "unordered": (
            Unordered("z", 1, Inner(2, 3), {"k": 1, "j": 2}, frozenset({"b", "a", "c"})),
            {"unique": BY_ARGS},
        ),
        "subset": (Subset(1, "t", Customer(2, "n"), Address("s", "c")), {"unique": BY_ARGS}),
        "kind_default": (WithKindDefault("x@example.com"), {}),
    }
    digests = {}
    for name, (args, options) in examples.items():
        digest = unique_key(args, now=EXAMPLE_NOW, **options)
        assert digest is not None
        digests[name] = digest.hex()
    return digests


@pytest.mark.parametrize(
    ("tz", "hash_seed"), [("Asia/Tokyo", "1"), ("America/St_Johns", "2"), ("UTC", "3")]
)
def test_same_keys_in_another_time_zone_and_process(tz: str, hash_seed: str) -> None:
    env = {
        **os.environ,
        "TZ": tz,
        "PYTHONHASHSEED": hash_seed,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    script = (
        "import json, time; time.tzset(); "
        "from tests.unit.test_keys import example_digests; "
        "print(json.dumps({'digests': example_digests(), 'zone': time.tzname}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    child = json.loads(result.stdout)
    if tz != "UTC":
        assert child["zone"][0] != "UTC", "the child did not take the time zone"
    assert child["digests"] == example_digests()


def test_importing_sa_jobs_does_not_import_hypothesis() -> None:
    script = "import sys, sa_jobs; print('hypothesis' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_sa_jobs_testing_without_hypothesis_says_what_to_install() -> None:
    # Make "import hypothesis" (and pytest) fail in a child process: the assertions and
    # run_jobs still import, and only a strategy asks for Hypothesis, saying how to get it.
    script = (
        "import sys; sys.modules['hypothesis'] = None; sys.modules['pytest'] = None\n"
        "import sa_jobs\n"
        "from sa_jobs.testing import assert_enqueued, run_jobs\n"
        "try:\n"
        "    from sa_jobs.testing import args_values\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "pip install hypothesis" in result.stdout
