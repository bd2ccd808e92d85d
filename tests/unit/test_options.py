"""Insert, unique and sequence options: what is refused when they are built, and how
call-site options, a kind's declared defaults and the library defaults combine.

``tests/unit/test_args.py`` already covers the common range checks of ``InsertOpts``
(priority, max attempts, queue, tags, metadata, naive ``scheduled_at``), per-kind
defaults and the basic precedence of :meth:`InsertOpts.resolve`;
``tests/unit/test_bounds.py`` covers out-of-range instants and the largest TTL;
``tests/unit/test_keys.py`` covers ``by_state`` missing a required state. This module
covers the rest: job keys, unique and sequence options and how they resolve, the edges
of ``scheduled_at`` and ``timeout``, and the states a unique job blocks in.
"""

from __future__ import annotations

import datetime as dt
import types
from collections.abc import Iterator
from typing import Any

import pytest

import sa_jobs
from sa_jobs._base.durations import EARLIEST_INSTANT, LATEST_INSTANT, MAX_TIMEOUT, MAX_TTL
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import kind_of
from sa_jobs._declare.option_checks import check_timeout
from sa_jobs._declare.options import (
    DEFAULT_UNIQUE_STATES,
    REQUIRED_UNIQUE_STATES,
    InsertOpts,
    JobKeyMode,
    KindDefaults,
    SequenceOpts,
    UniqueOpts,
)
from sa_jobs.errors import InvalidOptionsError

ONE_MICROSECOND = dt.timedelta(microseconds=1)


def refused(option: str, **opts: Any) -> InvalidOptionsError:
    """Build ``InsertOpts(**opts)``, expecting it to be refused for ``option``."""
    with pytest.raises(InvalidOptionsError) as exc:
        InsertOpts(**opts)
    assert exc.value.option == option
    assert str(exc.value).startswith(f"{option}: ")
    return exc.value


def as_option(option: str, value: Any) -> dict[str, Any]:
    return {option: value}


# --------------------------------------------------------------------------- job keys


@pytest.mark.parametrize(
    "job_key",
    ["", 7, b"bytes-key", "k" * 513, "nul\x00key", "lone \udc00 surrogate"],
    ids=["empty", "int", "bytes", "513-chars", "nul", "surrogate"],
)
def test_a_job_key_that_is_not_a_storable_string_of_1_to_512_characters_is_refused(
    job_key: Any,
) -> None:
    refused("job_key", job_key=job_key)


def test_a_job_key_of_512_characters_is_accepted() -> None:
    assert InsertOpts(job_key="k" * 512).job_key == "k" * 512


def test_an_unknown_job_key_mode_is_refused_listing_the_modes() -> None:
    error = refused("job_key_mode", job_key="k", job_key_mode="overwrite")
    assert "replace, preserve_run_at, unsafe_dedupe" in str(error)


@pytest.mark.parametrize("mode", list(JobKeyMode))
def test_a_job_key_mode_may_be_given_as_its_string(mode: JobKeyMode) -> None:
    opts = InsertOpts(job_key="k", job_key_mode=mode.value)
    assert opts.job_key_mode is mode
    assert opts.resolve(KindDefaults()).job_key_mode is mode


def test_a_keyed_job_replaces_by_default() -> None:
    assert InsertOpts(job_key="k").resolve(KindDefaults()).job_key_mode is JobKeyMode.REPLACE


def test_a_job_key_mode_without_a_job_key_is_allowed_and_keys_nothing() -> None:
    resolved = InsertOpts(job_key_mode=JobKeyMode.UNSAFE_DEDUPE).resolve(KindDefaults())
    assert resolved.job_key is None
    assert resolved.job_key_mode is JobKeyMode.UNSAFE_DEDUPE


def test_a_job_key_with_call_site_unique_options_is_refused_when_resolved() -> None:
    opts = InsertOpts(job_key="k", unique=UniqueOpts(by_args=True))
    with pytest.raises(InvalidOptionsError, match="cannot be combined with unique") as exc:
        opts.resolve(KindDefaults())
    assert exc.value.option == "job_key"


def test_a_job_key_on_a_kind_declared_unique_is_refused_unless_the_call_turns_it_off() -> None:
    declared = KindDefaults(unique=UniqueOpts(by_args=True))

    with pytest.raises(InvalidOptionsError, match=r"unique=UniqueOpts\(\) to turn"):
        InsertOpts(job_key="k").resolve(declared)
    resolved = InsertOpts(job_key="k", unique=UniqueOpts()).resolve(declared)

    assert resolved.job_key == "k"
    assert resolved.unique == UniqueOpts()
    assert resolved.unique.is_empty


@pytest.mark.parametrize(
    ("call_site", "declared"),
    [(SequenceOpts(), None), (None, SequenceOpts(by_args=True))],
    ids=["call-site-sequence", "kind-declared-sequence"],
)
def test_a_job_key_with_a_sequence_is_refused_when_resolved(
    call_site: SequenceOpts | None, declared: SequenceOpts | None
) -> None:
    opts = InsertOpts(job_key="k", sequence=call_site)
    with pytest.raises(InvalidOptionsError, match="cannot be combined with a sequence") as exc:
        opts.resolve(KindDefaults(sequence=declared))
    assert exc.value.option == "job_key"


# --------------------------------------------------------------------------- unique and sequence


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("unique", {"by_args": True}),
        ("unique", True),
        ("unique", SequenceOpts()),
        ("sequence", {"by_args": True}),
        ("sequence", UniqueOpts(by_args=True)),
    ],
    ids=["unique-dict", "unique-bool", "unique-sequence-opts", "sequence-dict", "sequence-unique"],
)
def test_unique_and_sequence_must_be_their_own_option_classes(option: str, value: Any) -> None:
    error = refused(option, **{option: value})
    assert type(value).__name__ in str(error)


@pytest.mark.parametrize("option", ["unique", "sequence"])
def test_a_kind_declaring_unique_or_sequence_of_the_wrong_type_is_refused(option: str) -> None:
    registry = sa_jobs.KindRegistry()
    declared: dict[str, Any] = {option: {"by_args": True}}
    with pytest.raises(InvalidOptionsError) as exc:
        sa_jobs.job_args(kind="wrong_type", registry=registry, **declared)
    assert exc.value.option == option
    assert "wrong_type" not in registry


def test_call_site_unique_and_sequence_win_over_the_kinds() -> None:
    declared = KindDefaults(unique=UniqueOpts(by_args=True), sequence=SequenceOpts())
    mine_unique, mine_sequence = UniqueOpts(by_queue=True), SequenceOpts(by_queue=True)

    resolved = InsertOpts(unique=mine_unique, sequence=mine_sequence).resolve(declared)

    assert resolved.unique is mine_unique
    assert resolved.sequence is mine_sequence


def test_unset_unique_and_sequence_fall_back_to_the_kinds_then_to_none() -> None:
    declared = KindDefaults(unique=UniqueOpts(by_args=True), sequence=SequenceOpts(by_args=True))

    from_kind = InsertOpts().resolve(declared)
    from_library = InsertOpts().resolve(KindDefaults())

    assert from_kind.unique == UniqueOpts(by_args=True)
    assert from_kind.sequence == SequenceOpts(by_args=True)
    assert (from_library.unique, from_library.sequence) == (None, None)


def test_a_declared_classes_unique_and_sequence_feed_resolution() -> None:
    @sa_jobs.job_args(
        kind="options.declared",
        registry=sa_jobs.KindRegistry(),
        queue="reports",
        unique=UniqueOpts(by_args=True, ttl=dt.timedelta(hours=1)),
        sequence=SequenceOpts(continue_on_cancelled=True),
    )
    class Declared:
        n: int = 0

    resolved = InsertOpts(priority=3).resolve(kind_of(Declared).defaults)

    assert (resolved.queue, resolved.priority) == ("reports", 3)
    assert resolved.unique == UniqueOpts(by_args=True, ttl=dt.timedelta(hours=1))
    assert resolved.sequence == SequenceOpts(continue_on_cancelled=True)


def test_excluding_the_kind_from_a_sequence_needs_args_or_queue() -> None:
    with pytest.raises(InvalidOptionsError, match="one sequence") as exc:
        SequenceOpts(exclude_kind=True)
    assert exc.value.option == "exclude_kind"
    assert SequenceOpts(exclude_kind=True, by_args=True).exclude_kind
    assert SequenceOpts(exclude_kind=True, by_queue=True).exclude_kind


# --------------------------------------------------------------------------- unique states


def test_a_unique_job_blocks_in_every_state_but_cancelled_and_discarded_by_default() -> None:
    states = UniqueOpts(by_args=True).states
    assert states == DEFAULT_UNIQUE_STATES
    assert JobState.COMPLETED in states
    assert JobState.CANCELLED not in states
    assert JobState.DISCARDED not in states


def test_with_a_ttl_a_completed_job_no_longer_blocks() -> None:
    states = UniqueOpts(by_args=True, ttl=dt.timedelta(minutes=5)).states
    assert states == DEFAULT_UNIQUE_STATES - {JobState.COMPLETED}


def test_an_explicit_by_state_decides_even_with_a_ttl() -> None:
    chosen = REQUIRED_UNIQUE_STATES | {JobState.COMPLETED}
    opts = UniqueOpts(by_args=True, ttl=dt.timedelta(minutes=5), by_state=chosen)
    assert opts.states == chosen
    assert JobState.RETRYABLE not in opts.states


def test_an_empty_by_state_means_the_default_states() -> None:
    assert UniqueOpts(by_args=True, by_state=[]) == UniqueOpts(by_args=True)
    assert UniqueOpts(by_args=True, by_state=[]).states == DEFAULT_UNIQUE_STATES
    # And on its own, like no option at all, it asks for no uniqueness.
    assert UniqueOpts(by_state=[]).is_empty


@pytest.mark.parametrize(
    ("by_state", "says"),
    [("available", "not a string"), (["available", "paused"], "'paused'")],
    ids=["a-string", "unknown-state"],
)
def test_by_state_must_be_a_list_of_known_states(by_state: Any, says: str) -> None:
    with pytest.raises(InvalidOptionsError, match=says) as exc:
        UniqueOpts(by_args=True, by_state=by_state)
    assert exc.value.option == "by_state"


def test_by_state_that_is_not_iterable_is_an_options_error() -> None:
    # Like every other wrong type given to an option (by_period=60, ttl=60, tags=5,
    # unique={}), not a bare TypeError from iterating it.
    with pytest.raises(InvalidOptionsError) as exc:
        UniqueOpts(by_args=True, by_state=5)  # type: ignore[arg-type]
    assert exc.value.option == "by_state"


@pytest.mark.parametrize(
    "opts",
    [
        UniqueOpts(by_args=True),
        UniqueOpts(by_period=dt.timedelta(minutes=1)),
        UniqueOpts(by_queue=True),
        UniqueOpts(by_state=REQUIRED_UNIQUE_STATES),
        UniqueOpts(exclude_kind=True),
        UniqueOpts(ttl=dt.timedelta(minutes=1)),
        UniqueOpts(until="start"),
    ],
    ids=["by_args", "by_period", "by_queue", "by_state", "exclude_kind", "ttl", "until"],
)
def test_any_one_unique_option_makes_the_job_unique(opts: UniqueOpts) -> None:
    assert not opts.is_empty
    assert UniqueOpts().is_empty


# --------------------------------------------------------------------------- ttl and by_period


@pytest.mark.parametrize("option", ["ttl", "by_period"])
@pytest.mark.parametrize(
    "value",
    [dt.timedelta(seconds=1) - ONE_MICROSECOND, dt.timedelta(0), dt.timedelta(seconds=-5)],
    ids=["just-under-a-second", "zero", "negative"],
)
def test_ttl_and_by_period_under_a_second_are_refused(option: str, value: dt.timedelta) -> None:
    with pytest.raises(InvalidOptionsError, match="at least 1 second") as exc:
        UniqueOpts(**as_option(option, value))
    assert exc.value.option == option


@pytest.mark.parametrize("option", ["ttl", "by_period"])
def test_ttl_and_by_period_of_exactly_a_second_are_accepted(option: str) -> None:
    opts = UniqueOpts(**as_option(option, dt.timedelta(seconds=1)))
    assert getattr(opts, option) == dt.timedelta(seconds=1)


@pytest.mark.parametrize("option", ["ttl", "by_period"])
def test_ttl_and_by_period_given_as_seconds_are_refused(option: str) -> None:
    with pytest.raises(InvalidOptionsError, match="must be a timedelta") as exc:
        UniqueOpts(**as_option(option, 60))
    assert exc.value.option == option


def test_a_ttl_one_microsecond_past_365_days_is_refused() -> None:
    with pytest.raises(InvalidOptionsError, match="365 days") as exc:
        UniqueOpts(ttl=MAX_TTL + ONE_MICROSECOND)
    assert exc.value.option == "ttl"


def test_by_period_has_no_upper_bound() -> None:
    # A period only buckets the insert time; it ends up in no stored instant.
    assert UniqueOpts(by_period=dt.timedelta(days=3650)).by_period == dt.timedelta(days=3650)


def test_until_is_success_or_start() -> None:
    with pytest.raises(InvalidOptionsError, match="'success' or 'start'") as exc:
        UniqueOpts(by_args=True, until="finish")
    assert exc.value.option == "until"
    assert UniqueOpts(until="start").until == "start"


# --------------------------------------------------------------------------- scheduled_at


class NoOffset(dt.tzinfo):
    """A tzinfo that does not know its offset: the datetime is naive in all but name."""

    def utcoffset(self, _dt: dt.datetime | None) -> dt.timedelta | None:
        return None

    def dst(self, _dt: dt.datetime | None) -> dt.timedelta | None:
        return None

    def tzname(self, _dt: dt.datetime | None) -> str | None:
        return None


def test_a_scheduled_at_whose_tzinfo_has_no_offset_counts_as_naive() -> None:
    error = refused("scheduled_at", scheduled_at=dt.datetime(2030, 1, 1, tzinfo=NoOffset()))
    assert "naive" in str(error)


@pytest.mark.parametrize(
    "instant",
    [EARLIEST_INSTANT, LATEST_INSTANT],
    ids=["earliest", "latest"],
)
def test_the_first_and_last_storable_instants_are_accepted_in_any_zone(
    instant: dt.datetime,
) -> None:
    for offset in (0, 14, -12):
        local = instant.astimezone(dt.timezone(dt.timedelta(hours=offset)))
        assert InsertOpts(scheduled_at=local).scheduled_at == instant


@pytest.mark.parametrize(
    "scheduled_at",
    [EARLIEST_INSTANT - ONE_MICROSECOND, LATEST_INSTANT + ONE_MICROSECOND],
    ids=["before-earliest", "after-latest"],
)
def test_one_microsecond_outside_the_storable_instants_is_refused(
    scheduled_at: dt.datetime,
) -> None:
    error = refused("scheduled_at", scheduled_at=scheduled_at)
    assert "from 0001-01-02 00:00:00 to 9999-12-30 00:00:00 UTC, both included" in str(error)


def test_the_last_days_later_instants_are_refused_by_a_message_that_agrees() -> None:
    # 9999-12-30 is the last day's date, but only its first instant is storable (the
    # table's CHECK ends at '9999-12-30 00:00:00+00'); the message must not call the
    # whole day inside.
    late = dt.datetime(9999, 12, 30, 23, 59, 59, tzinfo=dt.UTC)
    early = dt.datetime(1, 1, 1, 23, 59, 59, tzinfo=dt.UTC)

    for instant in (late, early):
        message = str(refused("scheduled_at", scheduled_at=instant))
        assert "to 9999-12-30 00:00:00 UTC" in message
        assert "from 0001-01-02 00:00:00" in message
        assert "0001-01-02 to 9999-12-30" not in message


def test_a_ttl_lock_ending_exactly_at_the_last_instant_is_accepted_and_one_past_is_not() -> None:
    ttl = dt.timedelta(days=1)
    at_the_edge = InsertOpts(scheduled_at=LATEST_INSTANT - ttl, unique=UniqueOpts(ttl=ttl))
    assert at_the_edge.resolve(KindDefaults()).scheduled_at == LATEST_INSTANT - ttl

    past = InsertOpts(
        scheduled_at=LATEST_INSTANT - ttl + ONE_MICROSECOND, unique=UniqueOpts(ttl=ttl)
    )
    with pytest.raises(InvalidOptionsError, match="plus the unique ttl") as exc:
        past.resolve(KindDefaults())
    assert exc.value.option == "scheduled_at"


def test_a_kind_declared_ttl_bounds_the_scheduled_at_of_the_call_too() -> None:
    declared = KindDefaults(unique=UniqueOpts(ttl=dt.timedelta(days=30)))
    late = InsertOpts(scheduled_at=LATEST_INSTANT - dt.timedelta(days=1))

    with pytest.raises(InvalidOptionsError, match="plus the unique ttl"):
        late.resolve(declared)
    # Turning the kind's uniqueness off at the call site lifts the bound.
    assert late.resolve(KindDefaults()).scheduled_at == LATEST_INSTANT - dt.timedelta(days=1)


# --------------------------------------------------------------------------- metadata and tags


def test_metadata_may_be_any_mapping_and_resolves_to_a_plain_dict() -> None:
    frozen = types.MappingProxyType({"trace": "abc"})
    resolved = InsertOpts(metadata=frozen).resolve(KindDefaults())
    assert type(resolved.metadata) is dict
    assert resolved.metadata == {"trace": "abc"}


def test_tags_may_be_any_iterable_of_strings_and_are_kept_in_order() -> None:
    def generated() -> Iterator[str]:
        yield from ("b", "a", "b")

    assert InsertOpts(tags=generated()).tags == ("b", "a", "b")
    assert InsertOpts(tags=("x",)).resolve(KindDefaults(tags=("y",))).tags == ("x",)


def test_tags_given_as_bytes_are_refused_not_read_as_numbers() -> None:
    refused("tags", tags=b"urgent")


# --------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [
        (0.001, dt.timedelta(milliseconds=1)),
        (MAX_TIMEOUT, MAX_TIMEOUT),
        (MAX_TIMEOUT + ONE_MICROSECOND, MAX_TIMEOUT),
        (MAX_TIMEOUT.total_seconds() + 1, MAX_TIMEOUT),
        (-0.5, None),
        (-86_400 * 400, None),
        (dt.timedelta.min, None),
    ],
    ids=[
        "a-millisecond",
        "exactly-365-days",
        "a-microsecond-more",
        "a-second-more-as-seconds",
        "negative-float",
        "a-negative-400-days",
        "timedelta.min",
    ],
)
def test_a_timeout_is_kept_clamped_to_365_days_or_means_no_limit_when_negative(
    timeout: Any, expected: dt.timedelta | None
) -> None:
    assert check_timeout(timeout) == expected


@pytest.mark.parametrize("timeout", [True, False, "60", [60]], ids=repr)
def test_a_timeout_that_is_not_a_duration_is_refused(timeout: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="must be a timedelta") as exc:
        check_timeout(timeout)
    assert exc.value.option == "timeout"


@pytest.mark.parametrize("timeout", [-(10**400), -1e300], ids=["huge-negative-int", "-1e300"])
def test_a_huge_negative_timeout_means_no_limit_like_any_negative_one(timeout: Any) -> None:
    # Negative means "no limit" however large: dt.timedelta(seconds=-1e300) would raise
    # OverflowError, so the sign is looked at before any timedelta is built.
    assert check_timeout(timeout) is None


def test_a_kind_declared_bool_timeout_is_refused_at_declaration() -> None:
    with pytest.raises(InvalidOptionsError) as exc:
        sa_jobs.job_args(kind="bool_timeout", registry=sa_jobs.KindRegistry(), timeout=True)
    assert exc.value.option == "timeout"
