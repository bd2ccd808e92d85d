"""Schedule math for periodic jobs: cron in a time zone across real DST changes, intervals
that keep their phase, and the catch-up plan. No database."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

import sa_jobs
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError
from sa_jobs.periodic.definition import check_periodic_jobs
from sa_jobs.periodic.plan import CATCH_UP_LIMIT, COUNT_LIMIT, Fire, plan
from sa_jobs.periodic.schedule import CronSchedule, IntervalSchedule, Schedule, build_schedule

NY = ZoneInfo("America/New_York")
UTC = dt.UTC
SECOND = dt.timedelta(seconds=1)


@sa_jobs.job_args(kind="periodic_unit_report")
class Report:
    day: str = ""


def ny(*parts: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=NY, fold=fold).astimezone(UTC)


def fires_between(schedule: Schedule, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    found, instant = [], start
    while (instant := schedule.after(start, instant)) <= end:
        found.append(instant)
    return found


def cron(expression: str, tz: str = "America/New_York") -> Schedule:
    return build_schedule(expression, tz)


# ------------------------------------------------------------------ DST, as cron users expect


def test_a_time_skipped_by_spring_forward_runs_once_right_after_the_jump() -> None:
    # 2026-03-08 02:00 EST jumps to 03:00 EDT: 02:30 does not exist that day.
    found = fires_between(cron("30 2 * * *"), ny(2026, 3, 7, 12), ny(2026, 3, 10, 12))
    assert found == [ny(2026, 3, 8, 3, 0), ny(2026, 3, 9, 2, 30), ny(2026, 3, 10, 2, 30)]


def test_a_time_repeated_by_fall_back_runs_once() -> None:
    # 2026-11-01 02:00 EDT falls back to 01:00 EST: 01:30 happens twice.
    found = fires_between(cron("30 1 * * *"), ny(2026, 10, 31, 12), ny(2026, 11, 2, 12))
    assert found == [ny(2026, 11, 1, 1, 30, fold=0), ny(2026, 11, 2, 1, 30)]


def test_a_time_in_the_repeated_hour_fires_once_even_when_asked_from_inside_it() -> None:
    # Asked at 01:10 EST (the second 01:10), the 01:30 of that day already fired (EDT).
    schedule = cron("30 1 * * *")
    assert schedule.after(ny(2026, 11, 1, 1, 10, fold=1), ny(2026, 11, 1, 1, 10, fold=1)) == ny(
        2026, 11, 2, 1, 30
    )


def test_wildcard_hours_follow_real_time_through_both_changes() -> None:
    hourly = cron("0 * * * *")
    spring = fires_between(hourly, ny(2026, 3, 8, 0, 30), ny(2026, 3, 8, 4, 30))
    assert spring == [ny(2026, 3, 8, 1), ny(2026, 3, 8, 3), ny(2026, 3, 8, 4)]
    assert [b - a for a, b in itertools.pairwise(spring)] == [dt.timedelta(hours=1)] * 2
    fall = fires_between(hourly, ny(2026, 11, 1, 0, 30), ny(2026, 11, 1, 2, 30))
    assert fall == [ny(2026, 11, 1, 1), ny(2026, 11, 1, 1, fold=1), ny(2026, 11, 1, 2)]


def test_a_nine_oclock_job_stays_at_nine_local_across_the_change() -> None:
    found = fires_between(cron("0 9 * * *"), ny(2026, 3, 7), ny(2026, 3, 9, 12))
    assert [f.astimezone(NY).hour for f in found] == [9, 9, 9]
    assert [f.hour for f in found] == [14, 13, 13]  # UTC moves instead


def test_before_is_after_backwards_across_dst() -> None:
    schedule = cron("*/20 1 * * *")
    start, end = ny(2026, 10, 31), ny(2026, 11, 2)
    forward = fires_between(schedule, start, end)
    backward, instant = [], end
    while (earlier := schedule.before(start, instant)) is not None and earlier > start:
        backward.append(earlier)
        instant = earlier
    assert backward[::-1] == forward
    assert len(forward) == 3 + 3 + 3  # three days' 01:00-01:40, the repeated hour once


def test_cron_defaults_to_utc_and_describes_itself() -> None:
    schedule = build_schedule("0  9 * * *", None)
    assert schedule.description == "0 9 * * * (UTC)"
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    assert schedule.after(start, start) == dt.datetime(2026, 1, 1, 9, tzinfo=UTC)
    assert cron("0 9 * * *").description == "0 9 * * * (America/New_York)"


def test_six_fields_mean_seconds_first() -> None:
    schedule = build_schedule("*/15 * * * * *", None)
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    assert schedule.after(start, start) == start + 15 * SECOND


# ------------------------------------------------------------------ intervals


def test_an_interval_keeps_its_phase_from_the_anchor() -> None:
    schedule = IntervalSchedule(dt.timedelta(minutes=10))
    anchor = dt.datetime(2026, 1, 1, 0, 3, tzinfo=UTC)
    assert schedule.after(anchor, anchor) == anchor + dt.timedelta(minutes=10)
    later = anchor + dt.timedelta(minutes=25)
    assert schedule.after(anchor, later) == anchor + dt.timedelta(minutes=30)
    assert schedule.before(anchor, later) == anchor + dt.timedelta(minutes=20)
    assert schedule.before(anchor, anchor + dt.timedelta(minutes=20)) == anchor + dt.timedelta(
        minutes=10
    )
    assert schedule.description == "every 10m"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (dt.timedelta(days=14), dt.timedelta(days=14, seconds=1)),
        (SECOND, dt.timedelta(seconds=1, microseconds=1)),
        (dt.timedelta(hours=1), dt.timedelta(minutes=61)),
    ],
)
def test_distinct_intervals_have_distinct_schedule_texts(
    first: dt.timedelta, second: dt.timedelta
) -> None:
    # The row's schedule is compared as text: two intervals with one text would let a
    # changed schedule go unnoticed.
    assert IntervalSchedule(first).description != IntervalSchedule(second).description


@pytest.mark.parametrize(
    ("interval", "text"),
    [
        (SECOND, "every 1s"),
        (dt.timedelta(seconds=90), "every 1m 30s"),
        (dt.timedelta(minutes=90), "every 1h 30m"),
        (dt.timedelta(days=14), "every 14d"),
        (dt.timedelta(days=14, seconds=1), "every 14d 1s"),
        (dt.timedelta(seconds=1, microseconds=1), "every 1.000001s"),
        (dt.timedelta(seconds=2, milliseconds=500), "every 2.5s"),
        (dt.timedelta(days=1, hours=2, minutes=3, seconds=4), "every 1d 2h 3m 4s"),
    ],
)
def test_an_interval_describes_itself_exactly_and_readably(
    interval: dt.timedelta, text: str
) -> None:
    assert IntervalSchedule(interval).description == text


# ------------------------------------------------------------------ catch-up


START = dt.datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = IntervalSchedule(dt.timedelta(minutes=1))
GRACE = dt.timedelta(seconds=30)


def test_a_due_instant_within_grace_fires_under_every_mode() -> None:
    for mode in ("skip", "once", "all"):
        planned = plan(MINUTE, START, START + 5 * SECOND, catch_up=mode, misfire_grace=GRACE)
        assert planned.fires == (Fire(START),)
        assert planned.next_run_at == START + dt.timedelta(minutes=1)
        assert planned.dropped == 0


def test_skip_fires_none_of_the_missed_instants() -> None:
    now = START + dt.timedelta(minutes=10, seconds=45)  # 10 missed (0..9), 10:00 is late too
    planned = plan(MINUTE, START, now, catch_up="skip", misfire_grace=GRACE)
    assert planned.fires == ()
    assert planned.dropped == 11
    assert planned.next_run_at == START + dt.timedelta(minutes=11)


def test_skip_still_fires_the_instant_that_is_only_a_little_late() -> None:
    now = START + dt.timedelta(minutes=10, seconds=5)
    planned = plan(MINUTE, START, now, catch_up="skip", misfire_grace=GRACE)
    assert planned.fires == (Fire(START + dt.timedelta(minutes=10)),)
    assert planned.dropped == 10


def test_once_fires_one_job_for_the_missed_lot() -> None:
    now = START + dt.timedelta(minutes=10, seconds=5)
    planned = plan(MINUTE, START, now, catch_up="once", misfire_grace=GRACE)
    assert planned.fires == (
        Fire(START + dt.timedelta(minutes=9), missed=10),
        Fire(START + dt.timedelta(minutes=10)),
    )
    assert planned.dropped == 0


def test_all_fires_one_job_per_missed_instant_oldest_first() -> None:
    now = START + dt.timedelta(minutes=3, seconds=5)
    planned = plan(MINUTE, START, now, catch_up="all", misfire_grace=GRACE)
    assert [f.instant for f in planned.fires] == [
        START + i * dt.timedelta(minutes=1) for i in range(4)
    ]


def test_all_is_bounded_to_the_most_recent_missed_instants() -> None:
    now = START + dt.timedelta(minutes=CATCH_UP_LIMIT + 500)
    planned = plan(MINUTE, START, now, catch_up="all", misfire_grace=SECOND)
    assert len(planned.fires) == CATCH_UP_LIMIT + 1  # the limit, and the on-time instant
    assert planned.fires[-1].instant == now
    assert planned.fires[0].instant == now - CATCH_UP_LIMIT * dt.timedelta(minutes=1)
    assert planned.dropped == 500


def test_a_long_catch_up_walks_one_cron_iterator_and_stops_counting_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[object] = []

    def counting(*args: object, **kwargs: object) -> CronSim:
        built.append(args)
        return CronSim(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("sa_jobs.periodic.schedule.CronSim", counting)
    every_second = build_schedule("* * * * * *", None)
    built.clear()
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    now = start + dt.timedelta(days=1)  # 86,400 missed instants
    planned = plan(every_second, start, now, catch_up="all", misfire_grace=GRACE)
    assert len(planned.fires) == CATCH_UP_LIMIT + GRACE.total_seconds()
    assert planned.dropped == COUNT_LIMIT - CATCH_UP_LIMIT + 1  # the count stops at the bound
    # The lock is held while this runs: a handful of iterators, not one per instant.
    assert len(built) <= 4


def test_a_run_on_start_instant_off_the_cron_grid_counts_as_missed_too() -> None:
    schedule = build_schedule("0 * * * *", None)
    off_grid = dt.datetime(2026, 1, 1, 0, 17, tzinfo=UTC)
    now = dt.datetime(2026, 1, 1, 2, 30, tzinfo=UTC)
    planned = plan(schedule, off_grid, now, catch_up="all", misfire_grace=GRACE)
    assert [f.instant for f in planned.fires] == [
        off_grid,
        dt.datetime(2026, 1, 1, 1, tzinfo=UTC),
        dt.datetime(2026, 1, 1, 2, tzinfo=UTC),
    ]


def test_catch_up_across_the_spring_forward_gap_counts_real_instants() -> None:
    schedule = cron("30 * * * *")
    planned = plan(
        schedule, ny(2026, 3, 8, 0, 30), ny(2026, 3, 8, 4, 45), catch_up="all", misfire_grace=GRACE
    )
    assert [f.instant for f in planned.fires] == [
        ny(2026, 3, 8, 0, 30),
        ny(2026, 3, 8, 1, 30),
        ny(2026, 3, 8, 3, 30),
        ny(2026, 3, 8, 4, 30),
    ]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("schedule", "kwargs", "option"),
    [
        ("61 * * * *", {}, "schedule"),
        ("* * *", {}, "schedule"),
        ("0 0 30 2 *", {}, "schedule"),
        (42, {}, "schedule"),
        (dt.timedelta(milliseconds=999), {}, "schedule"),
        (dt.timedelta(minutes=1), {"tz": "UTC"}, "tz"),
        ("0 9 * * *", {"tz": "Mars/Olympus"}, "tz"),
        ("0 9 * * *", {"catch_up": "some"}, "catch_up"),
        ("0 9 * * *", {"name": ""}, "name"),
        ("0 9 * * *", {"queue": ""}, "queue"),
        ("0 9 * * *", {"misfire_grace": dt.timedelta(seconds=-1)}, "misfire_grace"),
        ("0 9 * * *", {"opts": sa_jobs.InsertOpts(scheduled_at=START)}, "opts"),
        ("0 9 * * *", {"opts": sa_jobs.InsertOpts(queue="a"), "queue": "b"}, "queue"),
    ],
)
def test_bad_periodic_jobs_fail_where_they_are_built(
    schedule: object, kwargs: dict[str, object], option: str
) -> None:
    arguments: dict[str, object] = {"name": "report", **kwargs}
    with pytest.raises(InvalidOptionsError) as caught:
        sa_jobs.PeriodicJob(schedule, Report(), **arguments)  # type: ignore[arg-type]
    assert caught.value.option == option


def test_args_must_be_job_args_or_a_factory() -> None:
    with pytest.raises(InvalidJobArgsError):
        sa_jobs.PeriodicJob("0 9 * * *", 42, name="report")
    factory = sa_jobs.PeriodicJob("0 9 * * *", lambda: Report(day="today"), name="a")
    assert factory.build_args() == Report(day="today")
    by_class = sa_jobs.PeriodicJob("0 9 * * *", Report, name="b")
    assert by_class.build_args() == Report()
    broken = sa_jobs.PeriodicJob("0 9 * * *", lambda: "not args", name="c")
    with pytest.raises(InvalidJobArgsError):
        broken.build_args()


@sa_jobs.job_args(kind="periodic_unit_needs_a_day")
class NeedsADay:
    day: str


@pytest.mark.parametrize(
    "factory",
    [NeedsADay, lambda day: NeedsADay(day), functools.partial(lambda a, b: Report(), 1)],
    ids=["class with a required field", "lambda with an argument", "partial still short"],
)
def test_a_factory_that_needs_arguments_is_refused_when_built(factory: object) -> None:
    with pytest.raises(InvalidOptionsError, match="cannot be called with no arguments") as caught:
        sa_jobs.PeriodicJob("0 9 * * *", factory, name="report")
    assert caught.value.option == "args"


def test_factories_callable_with_no_arguments_are_accepted() -> None:
    def with_defaults(day: str = "today", *rest: object, **more: object) -> Report:
        return Report(day=day)

    for factory in (with_defaults, functools.partial(NeedsADay, "monday"), Report):
        sa_jobs.PeriodicJob("0 9 * * *", factory, name="report")
    # A builtin without a signature cannot be checked: it is given the benefit of the doubt.
    sa_jobs.PeriodicJob("0 9 * * *", dict, name="report")


@pytest.mark.parametrize(
    ("macro", "expression"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_cron_shorthands_mean_their_expressions(macro: str, expression: str) -> None:
    schedule = build_schedule(macro, "Europe/Paris")
    assert schedule.description == build_schedule(expression, "Europe/Paris").description
    start = dt.datetime(2026, 5, 4, 12, 30, tzinfo=UTC)
    assert schedule.after(start, start) == build_schedule(expression, "Europe/Paris").after(
        start, start
    )


def test_reboot_and_unknown_shorthands_are_refused_with_a_reason() -> None:
    with pytest.raises(InvalidOptionsError, match="run_on_start"):
        build_schedule("@reboot", None)
    with pytest.raises(InvalidOptionsError, match="not a cron shorthand"):
        build_schedule("@fortnightly", None)


def test_two_periodic_jobs_with_one_name_are_refused() -> None:
    first = sa_jobs.PeriodicJob("0 9 * * *", Report(), name="report")
    second = sa_jobs.PeriodicJob(dt.timedelta(hours=1), Report(), name="report")
    with pytest.raises(InvalidOptionsError, match="two periodic jobs are named 'report'"):
        check_periodic_jobs([first, second])
    with pytest.raises(InvalidOptionsError, match="PeriodicJob"):
        check_periodic_jobs(["0 9 * * *"])


def test_cron_schedules_are_cron_schedules() -> None:
    assert isinstance(cron("0 9 * * *"), CronSchedule)
