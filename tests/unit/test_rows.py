"""From job args and options to the rows the insert statement reads, without a database.

:mod:`sa_jobs._insert.rows` turns each job into one validated JSON row; a row carries the core
fields always and a feature's fields only when the job uses that feature, so rows stay
small and a database without the feature branches can take plain rows.
:mod:`sa_jobs._insert.insert_statement` decides the statement's shape from the rows, binds them
as one parameter, and maps the rows a unique statement returned in key order back to
input order. What the database then does with the rows is covered by
``tests/integration/test_insert.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import sa_jobs
from sa_jobs._base.records import JobRow
from sa_jobs._declare.args import kind_of
from sa_jobs._declare.options import (
    DEFAULT_UNIQUE_STATES,
    REQUIRED_UNIQUE_STATES,
    InsertOpts,
    JobKeyMode,
    insert_opts,
)
from sa_jobs._insert import rows as rows_module
from sa_jobs._insert.insert_statement import (
    ROWS_PARAM,
    InsertShape,
    in_input_order,
    rows_param,
    shape_of,
)
from sa_jobs._insert.rows import build_rows, row_for, row_of_job
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError

REGISTRY = sa_jobs.KindRegistry()

CORE_FIELDS = {
    "kind",
    "args",
    "queue",
    "priority",
    "max_attempts",
    "tags",
    "metadata",
    "scheduled_at",
}
UNIQUE_FIELDS = {"unique_key", "unique_states", "unique_ttl", "unique_until_start"}
SEQUENCE_FIELDS = {
    "sequence_key",
    "sequence_continue_on_cancelled",
    "sequence_continue_on_discarded",
}
JOB_KEY_FIELDS = {"job_key", "job_key_mode"}


@sa_jobs.job_args(kind="rows.plain", registry=REGISTRY)
class Plain:
    n: int = 0


@sa_jobs.job_args(
    kind="rows.mail", registry=REGISTRY, queue="mail", priority=2, max_attempts=5, tags=["out"]
)
class Mail:
    to: str = "a@example.com"


@sa_jobs.job_args(kind="rows.deduped", registry=REGISTRY, unique=sa_jobs.UniqueOpts(by_args=True))
class Deduped:
    n: int = 0


@sa_jobs.job_args(kind="rows.sequenced", registry=REGISTRY, sequence=sa_jobs.SequenceOpts())
class Sequenced:
    account: int = 0


@sa_jobs.job_args(kind="rows.anything", registry=REGISTRY)
class Anything:
    payload: Any = None


def row(args: object, **opts: Any) -> JobRow:
    """The one row ``build_rows`` makes for ``args`` with these options."""
    (only,) = build_rows([(args, InsertOpts(**opts))])
    return only


def is_key(value: object) -> bool:
    """A ``\\x``-prefixed lowercase hex SHA-256 digest, as the statement reads bytea."""
    return (
        isinstance(value, str)
        and value.startswith("\\x")
        and len(value) == 2 + 64
        and all(c in "0123456789abcdef" for c in value[2:])
    )


# --------------------------------------------------------------------------- core fields


def test_a_plain_job_row_carries_the_core_fields_and_nothing_else() -> None:
    assert row(Plain(3)) == {
        "kind": "rows.plain",
        "args": {"n": 3},
        "queue": "default",
        "priority": 1,
        "max_attempts": 25,
        "tags": [],
        "metadata": {},
        "scheduled_at": None,
    }


def test_a_row_carries_the_kinds_defaults_unless_the_call_site_sets_them() -> None:
    declared = row(Mail())
    overridden = row(Mail(), queue="urgent", tags=[], max_attempts=1)

    assert (declared["queue"], declared["priority"], declared["max_attempts"]) == ("mail", 2, 5)
    assert declared["tags"] == ["out"]
    assert (overridden["queue"], overridden["priority"]) == ("urgent", 2)
    assert (overridden["max_attempts"], overridden["tags"]) == (1, [])


def test_row_for_takes_the_args_json_as_given_with_the_kinds_defaults() -> None:
    built = row_for(kind_of(Mail), {"to": "b@example.com"}, InsertOpts(metadata={"k": [1]}))

    assert built["kind"] == "rows.mail"
    assert built["args"] == {"to": "b@example.com"}
    assert built["queue"] == "mail"
    assert built["metadata"] == {"k": [1]}


@pytest.mark.parametrize(
    "scheduled_at",
    [
        dt.datetime(2030, 1, 1, 9, 0, tzinfo=ZoneInfo("Asia/Tokyo")),
        dt.datetime(2030, 7, 1, 12, 30, 15, 250_000, tzinfo=dt.UTC),
        dt.datetime(2030, 3, 1, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
    ],
    ids=["tokyo", "utc-with-microseconds", "minus-0330"],
)
def test_scheduled_at_travels_as_iso_text_with_its_offset(scheduled_at: dt.datetime) -> None:
    text = row(Plain(), scheduled_at=scheduled_at)["scheduled_at"]

    assert text == scheduled_at.isoformat()
    assert text is not None
    back = dt.datetime.fromisoformat(text)
    assert back == scheduled_at
    assert back.utcoffset() == scheduled_at.utcoffset()


def test_every_row_is_plain_json() -> None:
    built = row(
        Mail(),
        tags=("a", "b"),
        metadata={"nested": {"list": [1, 2.5, None]}},
        scheduled_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
        unique=sa_jobs.UniqueOpts(by_args=True, ttl=dt.timedelta(minutes=5)),
    )
    assert json.loads(json.dumps(built)) == built
    assert built["tags"] == ["a", "b"]


# --------------------------------------------------------------------------- unique fields


def test_only_a_unique_job_carries_a_unique_key() -> None:
    assert not UNIQUE_FIELDS & row(Plain()).keys()
    unique = row(Deduped(1))
    assert is_key(unique["unique_key"])
    # The default states, no TTL and "until success" are left for the statement to fill.
    assert unique.keys() == CORE_FIELDS | {"unique_key"}


def test_the_unique_key_follows_the_args_by_args_looks_at() -> None:
    assert row(Deduped(1))["unique_key"] == row(Deduped(1), priority=4)["unique_key"]
    assert row(Deduped(1))["unique_key"] != row(Deduped(2))["unique_key"]
    by_queue_only = sa_jobs.UniqueOpts(by_queue=True)
    assert (
        row(Deduped(1), unique=by_queue_only)["unique_key"]
        == row(Deduped(2), unique=by_queue_only)["unique_key"]
    )


def test_empty_unique_options_at_the_call_site_turn_the_kinds_uniqueness_off() -> None:
    assert not UNIQUE_FIELDS & row(Deduped(1), unique=sa_jobs.UniqueOpts()).keys()


@pytest.mark.parametrize(
    ("opts", "extra"),
    [
        (sa_jobs.UniqueOpts(by_args=True, by_state=DEFAULT_UNIQUE_STATES), {}),
        (sa_jobs.UniqueOpts(by_args=True, by_state=[]), {}),
        # Bits in JobState order: available scheduled pending running retryable completed
        # cancelled discarded.
        (
            sa_jobs.UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES),
            {"unique_states": "11110000"},
        ),
        (
            sa_jobs.UniqueOpts(by_args=True, ttl=dt.timedelta(minutes=5)),
            {"unique_states": "11111000", "unique_ttl": 300.0},
        ),
        (
            sa_jobs.UniqueOpts(by_args=True, until="start"),
            {"unique_until_start": True},
        ),
    ],
    ids=["default-states-given", "empty-by-state", "required-states", "ttl", "until-start"],
)
def test_unique_lock_fields_appear_only_when_they_differ_from_the_defaults(
    opts: sa_jobs.UniqueOpts, extra: dict[str, Any]
) -> None:
    built = row(Plain(1), unique=opts)

    assert is_key(built["unique_key"])
    assert {k: v for k, v in built.items() if k not in CORE_FIELDS | {"unique_key"}} == extra


# --------------------------------------------------------------------------- sequence fields


def test_only_a_sequenced_job_carries_sequence_fields() -> None:
    assert not SEQUENCE_FIELDS & row(Plain()).keys()

    sequenced = row(Sequenced(1))

    assert sequenced.keys() == CORE_FIELDS | SEQUENCE_FIELDS
    assert is_key(sequenced["sequence_key"])
    assert sequenced["sequence_continue_on_cancelled"] is False
    assert sequenced["sequence_continue_on_discarded"] is False


def test_a_sequence_key_groups_jobs_as_its_options_say() -> None:
    # By default every job of the kind shares one sequence; by_args splits them.
    assert row(Sequenced(1))["sequence_key"] == row(Sequenced(2))["sequence_key"]
    by_args = sa_jobs.SequenceOpts(by_args=True)
    assert (
        row(Sequenced(1), sequence=by_args)["sequence_key"]
        != row(Sequenced(2), sequence=by_args)["sequence_key"]
    )
    assert (
        row(Sequenced(1))["sequence_key"]
        != row(Plain(), sequence=sa_jobs.SequenceOpts())["sequence_key"]
    )


def test_a_call_site_sequence_carries_its_continue_flags() -> None:
    built = row(Plain(), sequence=sa_jobs.SequenceOpts(continue_on_discarded=True))
    assert built["sequence_continue_on_cancelled"] is False
    assert built["sequence_continue_on_discarded"] is True


# --------------------------------------------------------------------------- job key fields


@pytest.mark.parametrize(
    ("mode", "stored"),
    [(None, "replace"), *((mode, mode.value) for mode in JobKeyMode)],
    ids=["default", *(mode.value for mode in JobKeyMode)],
)
def test_a_keyed_job_carries_its_key_and_mode(mode: JobKeyMode | None, stored: str) -> None:
    built = row(Plain(), job_key="user:7", job_key_mode=mode)

    assert built.keys() == CORE_FIELDS | JOB_KEY_FIELDS
    assert (built["job_key"], built["job_key_mode"]) == ("user:7", stored)


def test_a_job_key_mode_without_a_key_adds_no_field() -> None:
    assert row(Plain(), job_key_mode=JobKeyMode.PRESERVE_RUN_AT).keys() == CORE_FIELDS


# --------------------------------------------------------------------------- bad input


def test_build_rows_keeps_input_order() -> None:
    built = build_rows([(Plain(n), InsertOpts(priority=1 + n % 4)) for n in range(6)])
    assert [(r["args"], r["priority"]) for r in built] == [({"n": n}, 1 + n % 4) for n in range(6)]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (({"n": 1}, InsertOpts()), InvalidJobArgsError),
        ((Anything(math.nan), InsertOpts()), InvalidJobArgsError),
        ((Anything({"k": "nul\x00"}), InsertOpts()), InvalidJobArgsError),
        ((Deduped(1), InsertOpts(job_key="k")), InvalidOptionsError),
        ((Sequenced(1), InsertOpts(job_key="k")), InvalidOptionsError),
        (
            (
                Deduped(1),
                InsertOpts(
                    scheduled_at=dt.datetime(9999, 12, 29, tzinfo=dt.UTC),
                    unique=sa_jobs.UniqueOpts(ttl=dt.timedelta(days=2)),
                ),
            ),
            InvalidOptionsError,
        ),
    ],
    ids=["not-args", "nan-arg", "nul-arg", "key-and-unique", "key-and-sequence", "ttl-past-9999"],
)
def test_one_bad_item_fails_the_whole_batch_before_any_row_is_handed_out(
    bad: tuple[object, InsertOpts], error: type[Exception]
) -> None:
    consumed: list[int] = []

    def items() -> Any:
        for index, item in enumerate([(Plain(1), InsertOpts()), bad, (Plain(2), InsertOpts())]):
            consumed.append(index)
            yield item

    with pytest.raises(error):
        build_rows(items())
    assert consumed == [0, 1]


# --------------------------------------------------------------------------- insert_opts


def test_insert_opts_takes_options_as_an_object_keywords_or_both_keywords_winning() -> None:
    base = InsertOpts(queue="a", priority=3)

    assert insert_opts(None, {}) == InsertOpts()
    assert insert_opts(base, {}) is base
    assert insert_opts(None, {"queue": "b"}) == InsertOpts(queue="b")
    assert insert_opts(base, {"queue": "b"}) == InsertOpts(queue="b", priority=3)


def test_insert_opts_validates_keywords_like_the_object_does() -> None:
    with pytest.raises(InvalidOptionsError) as exc:
        insert_opts(InsertOpts(queue="a"), {"priority": 9})
    assert exc.value.option == "priority"


def test_an_unknown_keyword_names_the_closest_option_even_next_to_an_opts_object() -> None:
    for opts in (None, InsertOpts(queue="a")):
        with pytest.raises(InvalidOptionsError, match="did you mean 'priority'") as exc:
            insert_opts(opts, {"priorty": 1})
        assert exc.value.option == "priorty"
    with pytest.raises(InvalidOptionsError, match="the options are job_key, ") as exc:
        insert_opts(None, {"colour": "red"})
    assert "did you mean" not in str(exc.value)


# --------------------------------------------------------------------------- hand-built jobs


def test_a_hand_built_job_of_an_unknown_kind_gets_the_library_defaults() -> None:
    built = row_of_job(Job(kind="handled.elsewhere", args_json={"x": 1}))

    assert built == {
        "kind": "handled.elsewhere",
        "args": {"x": 1},
        "queue": "default",
        "priority": 1,
        "max_attempts": 25,
        "tags": [],
        "metadata": {},
        "scheduled_at": None,
    }


def test_a_hand_built_job_keeps_what_it_sets() -> None:
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    job = Job(
        kind="handled.elsewhere",
        args_json=[1, 2],
        queue="q",
        priority=4,
        max_attempts=2,
        tags=["t"],
        metadata_={"m": True},
        scheduled_at=at,
    )

    built = row_of_job(job)

    assert (built["args"], built["queue"], built["priority"]) == ([1, 2], "q", 4)
    assert (built["max_attempts"], built["tags"], built["metadata"]) == (2, ["t"], {"m": True})
    assert built["scheduled_at"] == at.isoformat()


def test_a_hand_built_job_without_args_stores_an_empty_object() -> None:
    assert row_of_job(Job(kind="handled.elsewhere"))["args"] == {}


def test_a_hand_built_job_of_a_registered_kind_gets_its_defaults_and_unique_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # row_of_job looks kinds up in the global registry; lend it this module's instead.
    monkeypatch.setattr(rows_module, "default_registry", REGISTRY)

    mail = row_of_job(Job(kind="rows.mail", args_json={"to": "c@example.com"}))
    deduped = row_of_job(Job(kind="rows.deduped", args_json={"n": 5}))

    assert (mail["queue"], mail["priority"], mail["tags"]) == ("mail", 2, ["out"])
    assert deduped["unique_key"] == row(Deduped(5))["unique_key"]


@pytest.mark.parametrize(
    ("job", "error"),
    [
        (Job(kind="", args_json={}), InvalidJobArgsError),
        (Job(kind="k" * 129, args_json={}), InvalidJobArgsError),
        (Job(kind="ok", args_json={"x": math.inf}), InvalidJobArgsError),
        (Job(kind="ok", args_json={"x": "\x00"}), InvalidJobArgsError),
        (Job(kind="ok", args_json={1: "int key"}), InvalidJobArgsError),
        (Job(kind="ok", args_json={}, priority=9), InvalidOptionsError),
        (Job(kind="ok", args_json={}, tags="one-string"), InvalidOptionsError),
        (Job(kind="ok", args_json={}, metadata_=["x"]), InvalidOptionsError),
        (Job(kind="ok", args_json={}, scheduled_at=dt.datetime(2030, 1, 1)), InvalidOptionsError),
    ],
    ids=[
        "empty-kind",
        "long-kind",
        "inf-arg",
        "nul-arg",
        "int-key",
        "priority",
        "string-tags",
        "list-metadata",
        "naive-scheduled-at",
    ],
)
def test_a_hand_built_job_is_validated_like_any_insert(job: Job, error: type[Exception]) -> None:
    with pytest.raises(error):
        row_of_job(job)


@pytest.mark.parametrize("args_json", ["just text", 42, True], ids=["string", "number", "bool"])
def test_a_hand_built_job_whose_args_are_not_an_object_or_array_is_refused(
    args_json: Any,
) -> None:
    # The table's CHECK (sa_job_args_type_check) would refuse such a row with an
    # IntegrityError that aborts the caller's transaction; it is refused before any SQL.
    with pytest.raises(InvalidJobArgsError):
        row_of_job(Job(kind="handled.elsewhere", args_json=args_json))


# --------------------------------------------------------------------------- statement shape


def test_plain_rows_need_the_plain_statement() -> None:
    assert shape_of([row(Plain(1)), row(Mail())]) == InsertShape()
    assert shape_of([]) == InsertShape()


def test_one_unique_row_makes_the_statement_unique_and_numbered_when_not_alone() -> None:
    alone = shape_of([row(Deduped(1))])
    mixed = shape_of([row(Plain()), row(Deduped(1))])

    assert (alone.unique, alone.numbered, alone.sequenced) == (True, False, False)
    assert (mixed.unique, mixed.numbered, mixed.sequenced) == (True, True, False)


def test_a_sequenced_row_makes_the_statement_sequenced() -> None:
    shape = shape_of([row(Plain()), row(Sequenced(1))])
    assert (shape.sequenced, shape.unique, shape.numbered) == (True, False, False)


def test_shape_of_passes_sequence_locking_and_the_key_mode_through() -> None:
    shape = shape_of([row(Plain())], lock_sequences=True, job_key_mode=JobKeyMode.REPLACE)
    assert shape == InsertShape(lock_sequences=True, job_key_mode=JobKeyMode.REPLACE)


def test_rows_param_numbers_rows_in_input_order_without_touching_them() -> None:
    rows = [row(Plain(n)) for n in range(3)]

    param = rows_param(rows)

    assert list(param) == [ROWS_PARAM] == ["sa_jobs_rows"]
    assert param[ROWS_PARAM] == [{"ord": n, **rows[n]} for n in range(3)]
    assert all("ord" not in r for r in rows)
    json.dumps(param)


# --------------------------------------------------------------------------- input order


def database_order(sent: list[JobRow]) -> list[int]:
    """The order a unique statement inserts (and returns) rows in: by ``(unique_key,
    ord)`` with the key compared as bytea and rows without a key last."""

    def key(index: int) -> tuple[bool, bytes, int]:
        unique_key = sent[index].get("unique_key")
        if unique_key is None:
            return (True, b"", index)
        return (False, bytes.fromhex(unique_key[2:]), index)

    return sorted(range(len(sent)), key=key)


def returned_by_database(sent: list[JobRow]) -> list[str]:
    """What the statement returns: a marker per row, in the database's order."""
    return [f"row {index}" for index in database_order(sent)]


@pytest.mark.parametrize("seed", range(40))
def test_rows_returned_in_key_order_come_back_in_input_order(seed: int) -> None:
    rng = random.Random(seed)
    sent = [
        row(Deduped(rng.randrange(1000))) if rng.random() < 0.7 else row(Plain())
        for _ in range(rng.randrange(1, 30))
    ]

    assert in_input_order(sent, returned_by_database(sent)) == [
        f"row {index}" for index in range(len(sent))
    ]


def test_the_key_order_is_really_undone() -> None:
    sent = [row(Deduped(n)) for n in range(8)]
    assert database_order(sent) != list(range(8))  # else the test below proves nothing

    assert in_input_order(sent, returned_by_database(sent)) == [f"row {n}" for n in range(8)]


def test_rows_with_the_same_key_keep_their_input_order() -> None:
    sent = [row(Plain()), row(Deduped(1)), row(Deduped(2)), row(Deduped(1)), row(Plain())]
    assert in_input_order(sent, returned_by_database(sent)) == [f"row {n}" for n in range(5)]


def test_rows_without_keys_are_returned_as_they_were_sent() -> None:
    sent = [row(Plain(n)) for n in range(4)]
    assert in_input_order(sent, ["a", "b", "c", "d"]) == ["a", "b", "c", "d"]
