"""Periodic jobs against the real database: the ticker with an injected clock (restarts,
catch-up, DST, run_now, retirement, concurrent tickers), the worker, and the CLI."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
from collections.abc import Callable, Iterator
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import URL, DateTime, Engine, literal, null, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, PeriodicJob
from sa_jobs._table.schema import PERIODIC_BRANCH
from sa_jobs._table.service_tables import PeriodicState
from sa_jobs.cli import main
from sa_jobs.errors import InvalidOptionsError, PeriodicJobNotFoundError, SchemaMissingError
from sa_jobs.periodic import periodic_jobs, run_now
from sa_jobs.worker.maintenance import periodic as ticking
from sa_jobs.worker.maintenance.periodic import PeriodicRetirer, PeriodicTicker
from tests.helpers import url_text, wait_until

UTC = dt.UTC
NY = ZoneInfo("America/New_York")
T0 = dt.datetime(2026, 5, 4, 12, 0, 0, 500_000, tzinfo=UTC)
MINUTE = dt.timedelta(minutes=1)
SECOND = dt.timedelta(seconds=1)


@sa_jobs.job_args(kind="periodic_report")
class Report:
    label: str = ""


class Clock:
    """The tick's "now", moved by the test."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self, _connection: object) -> dt.datetime:
        return self.now

    def advance(self, delta: dt.timedelta) -> dt.datetime:
        self.now += delta
        return self.now


def tick(engine: Engine, ticker: PeriodicTicker) -> int:
    with engine.begin() as connection:
        return ticker.run_once(connection)


def periodic_jobs_of(engine: Engine, name: str) -> list[Job]:
    with Session(engine) as session:
        jobs = session.scalars(select(Job).order_by(Job.id)).all()
        return [job for job in jobs if job.metadata_.get("periodic", {}).get("name") == name]


def instants(engine: Engine, name: str) -> list[dt.datetime]:
    return [
        dt.datetime.fromisoformat(job.metadata_["periodic"]["instant"])
        for job in periodic_jobs_of(engine, name)
    ]


def state(engine: Engine, name: str) -> PeriodicState:
    with Session(engine) as session:
        row = session.get(PeriodicState, name)
        assert row is not None
        session.expunge(row)
        return row


def every_minute(**options: object) -> PeriodicJob:
    return PeriodicJob(MINUTE, Report("m"), name="minutely", **options)  # type: ignore[arg-type]


# ------------------------------------------------------------------ firing, restarts


def test_registers_then_fires_each_instant_once(engine: Engine) -> None:
    clock = Clock(T0)
    ticker = PeriodicTicker([every_minute()], clock=clock)
    assert tick(engine, ticker) == 0
    assert state(engine, "minutely").next_run_at == T0 + MINUTE
    clock.advance(MINUTE + SECOND)
    assert tick(engine, ticker) == 1
    assert tick(engine, ticker) == 0  # the same instant again: nothing
    (job,) = periodic_jobs_of(engine, "minutely")
    assert job.args == Report("m")
    assert job.scheduled_at == T0 + MINUTE
    row = state(engine, "minutely")
    assert (row.last_run_at, row.last_job_id, row.next_run_at) == (
        T0 + MINUTE,
        job.id,
        T0 + 2 * MINUTE,
    )


def test_a_restart_neither_repeats_nor_skips_an_instant(engine: Engine) -> None:
    clock = Clock(T0)
    first = PeriodicTicker([every_minute()], clock=clock)
    tick(engine, first)
    clock.advance(MINUTE + SECOND)
    tick(engine, first)
    # A new process (a deploy) registers the same schedule: the row keeps its instants.
    restarted = PeriodicTicker([every_minute()], clock=clock)
    assert tick(engine, restarted) == 0
    # Down across the next instant, back 20 s after it (within the grace): it fires.
    clock.advance(MINUTE + 20 * SECOND)
    again = PeriodicTicker([every_minute()], clock=clock)
    assert tick(engine, again) == 1
    assert instants(engine, "minutely") == [T0 + MINUTE, T0 + 2 * MINUTE]


def test_an_interval_keeps_its_phase_across_restarts(engine: Engine) -> None:
    clock = Clock(T0)
    long = PeriodicJob(dt.timedelta(hours=6), Report(), name="six_hourly")
    tick(engine, PeriodicTicker([long], clock=clock))
    # River #791: restarts every hour never let a 6-hour interval fire. Here they do.
    for _ in range(7):
        clock.advance(dt.timedelta(hours=1))
        tick(engine, PeriodicTicker([long], clock=clock))
    assert instants(engine, "six_hourly") == [T0 + dt.timedelta(hours=6)]


def test_run_on_start_fires_when_the_schedule_is_new_not_at_every_restart(engine: Engine) -> None:
    clock = Clock(T0)
    job = PeriodicJob("0 3 * * *", Report(), name="nightly", run_on_start=True)
    assert tick(engine, PeriodicTicker([job], clock=clock)) == 1
    clock.advance(MINUTE)
    assert tick(engine, PeriodicTicker([job], clock=clock)) == 0
    assert instants(engine, "nightly") == [T0]
    assert state(engine, "nightly").next_run_at == dt.datetime(2026, 5, 5, 3, tzinfo=UTC)


def test_a_changed_schedule_starts_over_from_the_new_one(engine: Engine) -> None:
    clock = Clock(T0)
    tick(engine, PeriodicTicker([PeriodicJob("0 3 * * *", Report(), name="r")], clock=clock))
    clock.advance(SECOND)  # a process started later, with the new code
    changed = PeriodicJob("*/5 * * * *", Report(), name="r")
    tick(engine, PeriodicTicker([changed], clock=clock))
    row = state(engine, "r")
    assert row.schedule == "*/5 * * * * (UTC)"
    assert row.next_run_at == dt.datetime(2026, 5, 4, 12, 5, tzinfo=UTC)


@pytest.fixture
def register_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sa_jobs.worker.maintenance.periodic.REGISTER_INTERVAL", 0.0)


@pytest.mark.usefixtures("register_every_tick")
def test_in_a_rolling_deploy_the_newest_process_decides_the_schedule_once(
    engine: Engine,
) -> None:
    # An old and a new version of the code disagree on the schedule and both keep
    # re-registering. The newer process's schedule takes over once; the older one never
    # takes it back, so nothing is reset, repeated or skipped.
    clock = Clock(T0)
    old = PeriodicTicker(
        [PeriodicJob(dt.timedelta(hours=1), Report(), name="r", run_on_start=True)], clock=clock
    )
    new = PeriodicTicker(
        [PeriodicJob(dt.timedelta(minutes=90), Report(), name="r", run_on_start=True)],
        clock=clock,
    )
    tick(engine, old)  # the old version's first deploy: its run_on_start fires
    clock.advance(MINUTE)
    new_start = clock.now
    while clock.now < T0 + dt.timedelta(hours=5):
        tick(engine, new)
        clock.advance(30 * SECOND)
        tick(engine, old)
        clock.advance(30 * SECOND)
    ninety = dt.timedelta(minutes=90)
    assert instants(engine, "r") == [T0, *(new_start + k * ninety for k in range(4))]
    assert state(engine, "r").schedule == "every 1h 30m"


@pytest.mark.usefixtures("register_every_tick")
def test_a_process_started_earlier_never_takes_the_schedule_back(engine: Engine) -> None:
    clock = Clock(T0)
    hourly = PeriodicJob(dt.timedelta(hours=1), Report(), name="r")
    every_two = PeriodicJob(dt.timedelta(hours=2), Report(), name="r")
    old, new = PeriodicTicker([hourly], clock=clock), PeriodicTicker([every_two], clock=clock)
    tick(engine, old)
    clock.advance(SECOND)
    tick(engine, new)
    for _ in range(3):
        tick(engine, new)
        tick(engine, old)
    row = state(engine, "r")
    assert (row.schedule, row.next_run_at) == ("every 2h", T0 + SECOND + 2 * dt.timedelta(hours=1))
    # A process started later still (a rollback) decides again.
    clock.advance(SECOND)
    tick(engine, PeriodicTicker([hourly], clock=clock))
    assert state(engine, "r").schedule == "every 1h"


# ------------------------------------------------------------------ catch-up


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("skip", [T0 + 11 * MINUTE]),
        ("once", [T0 + 10 * MINUTE, T0 + 11 * MINUTE]),
        ("all", [T0 + i * MINUTE for i in range(1, 12)]),
    ],
)
def test_catch_up_decides_what_happens_to_instants_missed_while_nothing_ran(
    engine: Engine, mode: str, expected: list[dt.datetime]
) -> None:
    clock = Clock(T0)
    job = every_minute(catch_up=mode, misfire_grace=dt.timedelta(seconds=30))
    tick(engine, PeriodicTicker([job], clock=clock))
    clock.advance(11 * MINUTE + 5 * SECOND)  # instants 1..10 missed, 11 is 5 s late
    tick(engine, PeriodicTicker([job], clock=clock))
    assert instants(engine, "minutely") == expected
    if mode == "once":
        assert periodic_jobs_of(engine, "minutely")[0].metadata_["periodic"]["missed"] == 10
    assert state(engine, "minutely").next_run_at == T0 + 12 * MINUTE


# ------------------------------------------------------------------ DST


def run_clock_through(
    engine: Engine, job: PeriodicJob, start: dt.datetime, end: dt.datetime, step: dt.timedelta
) -> list[dt.datetime]:
    clock = Clock(start)
    ticker = PeriodicTicker([job], clock=clock)
    while clock.now <= end:
        tick(engine, ticker)
        clock.advance(step)
    return [instant.astimezone(NY) for instant in instants(engine, job.name)]


def local(*parts: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=NY, fold=fold)


def test_spring_forward_runs_the_skipped_time_once_right_after_the_jump(engine: Engine) -> None:
    start = local(2026, 3, 7, 23, 0).astimezone(UTC)
    end = local(2026, 3, 9, 4, 0).astimezone(UTC)
    daily = PeriodicJob("30 2 * * *", Report(), name="daily_0230", tz="America/New_York")
    fired = run_clock_through(engine, daily, start, end, dt.timedelta(minutes=5))
    assert fired == [local(2026, 3, 8, 3, 0), local(2026, 3, 9, 2, 30)]
    hourly = PeriodicJob("0 * * * *", Report(), name="hourly", tz="America/New_York")
    fired = run_clock_through(
        engine, hourly, start, local(2026, 3, 8, 4, 1).astimezone(UTC), MINUTE * 5
    )
    assert [f.hour for f in fired] == [0, 1, 3, 4]  # 02:00 does not exist; every real hour fires


def test_fall_back_runs_the_repeated_time_once(engine: Engine) -> None:
    start = local(2026, 10, 31, 23, 0).astimezone(UTC)
    end = local(2026, 11, 2, 3, 0).astimezone(UTC)
    daily = PeriodicJob("30 1 * * *", Report(), name="daily_0130", tz="America/New_York")
    fired = run_clock_through(engine, daily, start, end, dt.timedelta(minutes=5))
    assert fired == [local(2026, 11, 1, 1, 30), local(2026, 11, 2, 1, 30)]
    assert fired[0].utcoffset() == dt.timedelta(hours=-4)  # the first 01:30 (EDT)
    hourly = PeriodicJob("0 * * * *", Report(), name="hourly", tz="America/New_York")
    fired = run_clock_through(
        engine, hourly, start, local(2026, 11, 1, 2, 1).astimezone(UTC), MINUTE * 5
    )
    assert [(f.hour, f.utcoffset()) for f in fired] == [
        (0, dt.timedelta(hours=-4)),
        (1, dt.timedelta(hours=-4)),
        (1, dt.timedelta(hours=-5)),
        (2, dt.timedelta(hours=-5)),
    ]


# ------------------------------------------------------------------ exactly once, concurrently


def test_a_ticker_that_read_a_stale_row_inserts_nothing(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(T0)
    ticker = PeriodicTicker([every_minute()], clock=clock)
    tick(engine, ticker)
    stale = state(engine, "minutely").next_run_at
    clock.advance(MINUTE + SECOND)
    assert tick(engine, ticker) == 1
    # A split-brain second process that read the row before that tick committed (a
    # paused VM, a lost lease): its due-rows query answers the state it read. Its
    # compare-and-set matches nothing, so it inserts no job for that instant again.
    stale_read = select(
        literal("minutely").label("name"),
        literal(stale, DateTime(timezone=True)).label("next_run_at"),
        null().label("run_now_requested_at"),
    )
    monkeypatch.setattr(ticking, "periodic_due", lambda _schedules, _now: stale_read)
    split_brain = PeriodicTicker([every_minute()], clock=clock)
    assert tick(engine, split_brain) == 0
    assert instants(engine, "minutely") == [T0 + MINUTE]


def test_a_second_ticker_skips_the_row_another_is_firing(engine: Engine) -> None:
    clock = Clock(T0)
    first = PeriodicTicker([every_minute()], clock=clock)
    second = PeriodicTicker([every_minute()], clock=clock)
    tick(engine, first)
    tick(engine, second)  # registered (a registration would wait for the row lock)
    clock.advance(MINUTE + SECOND)
    inserted, release = threading.Event(), threading.Event()

    def pause(_ids: list[int]) -> None:
        inserted.set()
        assert release.wait(10)

    first.before_commit = pause
    thread = threading.Thread(target=tick, args=(engine, first))
    thread.start()
    assert inserted.wait(10)
    assert tick(engine, second) == 0  # the row is locked: skipped, nothing inserted
    release.set()
    thread.join(10)
    assert tick(engine, second) == 0  # committed: the instant moved on
    assert instants(engine, "minutely") == [T0 + MINUTE]


def test_a_failing_args_factory_leaves_the_other_periodic_jobs_and_its_instant_due(
    engine: Engine,
) -> None:
    clock = Clock(T0)
    calls = []

    def broken() -> object:
        calls.append(1)
        raise RuntimeError("no args today")

    jobs = [every_minute(), PeriodicJob(MINUTE, broken, name="broken")]
    ticker = PeriodicTicker(jobs, clock=clock)
    tick(engine, ticker)
    clock.advance(MINUTE + SECOND)
    assert tick(engine, ticker) == 1
    assert calls == [1]
    assert state(engine, "broken").next_run_at == T0 + MINUTE  # still due: retried next tick


# ------------------------------------------------------------------ run_now, retirement


def test_run_now_is_stored_and_honoured_by_the_next_tick(engine: Engine) -> None:
    clock = Clock(T0)
    ticker = PeriodicTicker([every_minute()], clock=clock)
    tick(engine, ticker)
    with Session(engine) as session, session.begin():
        requested = run_now(session, "minutely")
        assert run_now(session, "minutely") == requested  # one pending request
    assert tick(engine, ticker) == 1
    assert tick(engine, ticker) == 0
    (job,) = periodic_jobs_of(engine, "minutely")
    assert job.metadata_["periodic"]["run_now"] is True
    row = state(engine, "minutely")
    assert row.run_now_requested_at is None
    assert row.next_run_at == T0 + MINUTE  # the schedule is untouched
    with Session(engine) as session, pytest.raises(PeriodicJobNotFoundError):
        run_now(session, "nope")


def test_run_now_takes_an_async_session(engine: Engine) -> None:
    tick(engine, PeriodicTicker([every_minute()], clock=Clock(T0)))

    async def request() -> None:
        async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                assert isinstance(await run_now(session, "minutely"), dt.datetime)
        finally:
            await async_engine.dispose()

    asyncio.run(request())
    assert state(engine, "minutely").run_now_requested_at is not None


def test_periodic_jobs_gone_from_the_code_retire_after_the_grace(engine: Engine) -> None:
    clock = Clock(T0)
    tick(
        engine,
        PeriodicTicker([every_minute(), PeriodicJob(MINUTE, Report(), name="old")], clock=clock),
    )
    clock.advance(dt.timedelta(days=3))
    tick(engine, PeriodicTicker([every_minute()], clock=clock))  # "old" was removed
    retirer = PeriodicRetirer(dt.timedelta(days=2), clock=clock)
    with engine.begin() as connection:
        assert retirer.run_once(connection) == 0  # it first lets running workers re-mark
    clock.advance(3 * MINUTE)
    with engine.begin() as connection:
        assert retirer.run_once(connection) == 1
    with Session(engine) as session:
        assert [row.name for row in periodic_jobs(session)] == ["minutely"]


def test_after_a_long_downtime_rows_survive_until_their_workers_re_register(
    engine: Engine,
) -> None:
    clock = Clock(T0)
    tick(engine, PeriodicTicker([every_minute()], clock=clock))
    # Every process was down for longer than the grace; the new leader starts first.
    clock.advance(dt.timedelta(days=10))
    retirer = PeriodicRetirer(dt.timedelta(days=7), clock=clock)
    with engine.begin() as connection:
        assert retirer.run_once(connection) == 0
    clock.advance(30 * SECOND)  # the worker with the job starts a little later
    tick(engine, PeriodicTicker([every_minute()], clock=clock))
    clock.advance(5 * MINUTE)
    with engine.begin() as connection:
        assert retirer.run_once(connection) == 0
    assert state(engine, "minutely").schedule == "every 1m"


# ------------------------------------------------------------------ the worker


def test_a_worker_inserts_and_works_its_periodic_jobs(engine: Engine) -> None:
    done: list[str] = []
    worker = sa_jobs.Worker(
        engine,
        periodic=[PeriodicJob(SECOND, Report("tick"), name="every_second", run_on_start=True)],
        maintenance=sa_jobs.MaintenanceConfig(periodic_interval=0.1),
    )

    @worker.handler(Report)
    def handle(job: Job[Report]) -> None:
        done.append(job.args.label)

    worker.start()
    try:
        wait_until(lambda: len(done) >= 3, timeout=10, what="three periodic runs")
    finally:
        worker.stop()
    fired = instants(engine, "every_second")
    assert len(fired) == len(set(fired))
    assert all(b - a == SECOND for a, b in itertools.pairwise(fired))


def test_a_worker_refuses_two_periodic_jobs_with_one_name(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="two periodic jobs"):
        sa_jobs.Worker(engine, periodic=[every_minute(), every_minute()])


def test_a_worker_with_periodic_jobs_needs_the_periodic_branch(core_only: Engine) -> None:
    worker = sa_jobs.Worker(core_only, periodic=[every_minute()])
    with pytest.raises(SchemaMissingError) as caught:
        worker.start()
    assert caught.value.branch == PERIODIC_BRANCH
    assert not worker.is_running


def test_run_now_without_the_branch_names_it(core_only: Engine) -> None:
    with Session(core_only) as session, pytest.raises(SchemaMissingError) as caught:
        run_now(session, "x")
    assert caught.value.branch == PERIODIC_BRANCH


# ------------------------------------------------------------------ the CLI


@pytest.fixture
def cli(
    database_url: URL, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., tuple[int, str]]]:
    def run(*argv: str) -> tuple[int, str]:
        code = main([*argv, "--url", url_text(database_url)])
        return code, capsys.readouterr().out

    yield run


def test_periodic_list_shows_names_schedules_last_and_next_runs(
    engine: Engine, cli: Callable[..., tuple[int, str]]
) -> None:
    assert cli("periodic", "list") == (
        0,
        "no periodic jobs (a worker registers its periodic jobs when it starts)\n",
    )
    clock = Clock(T0)
    ticker = PeriodicTicker(
        [
            every_minute(),
            PeriodicJob(dt.timedelta(days=14, seconds=1), Report(), name="two_weeks"),
            PeriodicJob("0 9 * * MON-FRI", Report(), name="weekday", tz="Europe/Paris"),
        ],
        clock=clock,
    )
    tick(engine, ticker)
    clock.advance(MINUTE)
    tick(engine, ticker)
    code, out = cli("periodic", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "name",
        "schedule",
        "last",
        "run",
        "(UTC)",
        "last",
        "job",
        "next",
        "run",
        "(UTC)",
        "seen",
        "(UTC)",
    ]
    assert lines[1].startswith("minutely")
    assert "every 1m " in lines[1]
    assert "2026-05-04 12:01:00+00:00" in lines[1]  # last run
    assert "2026-05-04 12:02:00+00:00" in lines[1]  # next run
    assert lines[2].startswith("two_weeks")
    assert "every 14d 1s " in lines[2]
    assert lines[3].startswith("weekday")
    assert "0 9 * * MON-FRI (Europe/Paris)" in lines[3]
    assert "2026-05-05 07:00:00+00:00" in lines[3]
