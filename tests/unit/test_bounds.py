"""Every value that ends up in the database or in a thread wait is bounded where it is
made: delays, timeouts, TTLs, instants, error records, nested documents."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import pytest

import sa_jobs
from sa_jobs import InsertOpts, Job, UniqueOpts
from sa_jobs._base.durations import LATEST_INSTANT, MAX_DELAY, MAX_TTL
from sa_jobs._base.error_records import MAX_MESSAGE, MAX_TRACE, describe, error_record, storable
from sa_jobs._base.records import Ending
from sa_jobs._declare.args import kind_of
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError, JobCancel, JobSnooze
from sa_jobs.worker.execution import Execution, Interrupt
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY, ExponentialRetry, retry_delay
from sa_jobs.worker.watchdog import Watchdog

UTC = dt.UTC


def a_job(job_id: int = 1, attempt: int = 1, kind: str = "bounds", errors: int = 0) -> Job:
    return Job(
        id=job_id,
        kind=kind,
        attempt=attempt,
        run_count=attempt,
        max_attempts=25,
        args_json={},
        errors=[{"attempt": n, "error": "E"} for n in range(errors)],
    )


@sa_jobs.job_args(kind="bounds", registry=sa_jobs.KindRegistry())
class Bounds:
    n: int = 0


def handler_with_timeout(seconds: float) -> Handler:
    return Handler(
        kind=kind_of(Bounds),
        function=print,
        is_async=False,
        wants_session=False,
        timeout=dt.timedelta(seconds=seconds),
    )


# ----------------------------------------------------------------- error records


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise TypeError("no text for you")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("bad \x00 byte"), "ValueError: bad \ufffd byte"),
        (ValueError("lone \ud800 surrogate"), "ValueError: lone \ufffd surrogate"),
        (JobCancel("stop \x00 now"), "JobCancel: stop \ufffd now"),
        (BrokenStr(), "BrokenStr: <str() raised TypeError>"),
        (KeyError(), "KeyError: KeyError"),
    ],
    ids=["nul", "surrogate", "job-cancel", "str-raises", "empty"],
)
def test_an_error_record_is_always_storable(exc: BaseException, expected: str) -> None:
    record = error_record(3, exc)
    assert record["attempt"] == 3
    assert record["error"] == expected
    assert "\x00" not in record["trace"]
    record["trace"].encode("utf-8")  # no lone surrogates left


def test_a_long_message_keeps_its_beginning_and_says_how_much_was_cut() -> None:
    message = "x" * (MAX_MESSAGE * 3)
    text = describe(ValueError(message))
    assert text.startswith("ValueError: xxx")
    cut = len("ValueError: ") + len(message) - MAX_MESSAGE
    assert text.endswith(f"[… {cut} more characters]")
    assert len(text) < MAX_MESSAGE + 100


def test_a_long_traceback_keeps_its_innermost_frames() -> None:
    try:
        try:
            raise LookupError("y" * MAX_TRACE)
        except LookupError as cause:
            raise RuntimeError("at the bottom") from cause
    except RuntimeError as exc:
        trace = error_record(1, exc)["trace"]
    assert trace.startswith("[… ")
    assert "earlier characters]" in trace.splitlines()[0]
    assert trace.rstrip().endswith("RuntimeError: at the bottom")
    assert len(trace) < MAX_TRACE + 100


def test_storable_leaves_ordinary_text_alone() -> None:
    text = "héllo \U0001f30d \t\n 中文"
    assert storable(text) == text


# ----------------------------------------------------------------- snooze delays


@pytest.mark.parametrize("delay", [math.inf, -math.inf, math.nan, -1, dt.timedelta(seconds=-1)])
def test_a_snooze_that_is_negative_or_not_finite_is_refused_where_it_is_raised(delay: Any) -> None:
    with pytest.raises(InvalidOptionsError) as exc:
        JobSnooze(delay)
    assert exc.value.option == "snooze delay"


@pytest.mark.parametrize("delay", [1e13, 10**400, dt.timedelta.max, MAX_DELAY * 2])
def test_a_snooze_past_the_maximum_is_clamped_to_it(delay: Any) -> None:
    assert JobSnooze(delay).seconds == MAX_DELAY.total_seconds() == 365 * 86400


def test_a_snooze_within_range_is_kept() -> None:
    assert JobSnooze(dt.timedelta(minutes=5)).seconds == 300
    assert JobSnooze(0).seconds == 0


# ----------------------------------------------------------------- retry policies


class Answers:
    """A retry policy that answers ``value`` (or raises it)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def next_delay(self, job: Job) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    def __repr__(self) -> str:
        return f"Answers({self.value!r})"


def test_a_retry_policy_past_the_maximum_is_clamped() -> None:
    assert retry_delay(Answers(dt.timedelta.max), a_job()) == (MAX_DELAY.total_seconds(), None)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (dt.timedelta(seconds=-5), "cannot be negative"),
        (math.nan, "finite"),
        ("soon", "must be a timedelta"),
        (ZeroDivisionError("oops"), "raised ZeroDivisionError: oops"),
    ],
)
def test_a_misbehaving_retry_policy_falls_back_to_the_default_and_says_why(
    answer: Any, says: str
) -> None:
    delay, note = retry_delay(Answers(answer), a_job(attempt=2, errors=1))
    assert note is not None
    assert says in note
    assert "the default backoff was used" in note
    assert 16 * 0.9 <= delay <= 16 * 1.1  # the default: (errors + 1) ** 4, jittered


@pytest.mark.parametrize(
    ("attempt", "errors", "seconds"),
    [(1, 0, 1), (2, 0, 1), (2, 1, 16), (5, 2, 81), (9, 3, 256)],
    ids=["first", "after-a-snooze", "second-error", "attempt-5-two-errors", "four"],
)
def test_the_default_policy_counts_errors_like_river(
    attempt: int, errors: int, seconds: float
) -> None:
    # River: (len(errors) + 1) ** 4, not attempt ** 4: a job snoozed once that then fails
    # for the first time waits 1 s, not 16 s; attempt 5 with 2 errors waits 81 s, not 625.
    job = a_job(attempt=attempt, errors=errors)
    assert retry_delay(DEFAULT_RETRY_POLICY, job)[0] == pytest.approx(seconds, rel=0.11)
    assert isinstance(DEFAULT_RETRY_POLICY, ExponentialRetry)


def test_an_execution_records_a_misbehaving_policy_in_the_jobs_error() -> None:
    execution = Execution(a_job(), None, Answers(dt.timedelta(seconds=-1)), lambda *_: None)
    outcome = execution.outcome_for_exception(ValueError("boom"))
    assert outcome.ending is Ending.FAILED
    assert outcome.delay is not None and outcome.delay >= 0
    assert outcome.error is not None
    assert "cannot be negative" in outcome.error["retry_policy_error"]


def test_an_execution_makes_an_outcome_of_an_exception_whose_str_raises() -> None:
    execution = Execution(a_job(), None, DEFAULT_RETRY_POLICY, lambda *_: None)
    outcome = execution.outcome_for_exception(BrokenStr())
    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert outcome.error["error"] == "BrokenStr: <str() raised TypeError>"


# ----------------------------------------------------------------- the watchdog


def test_a_deadline_past_threadings_range_does_not_stop_the_watchdog() -> None:
    # threading waits refuse timeouts past ~292 years with OverflowError; that used to
    # end the watchdog thread, and with it every later timeout.
    settled: list[tuple[int, Ending | None]] = []
    far = Execution(a_job(1), None, DEFAULT_RETRY_POLICY, lambda *_: None)
    far.deadline = time.monotonic() + 1e15
    near = Execution(
        a_job(2),
        handler_with_timeout(0.05),
        DEFAULT_RETRY_POLICY,
        lambda execution, outcome, _by_runner: settled.append(
            (execution.job.id, outcome.ending if outcome else None)
        ),
    )
    watchdog = Watchdog(grace=0.05)
    watchdog.start()
    try:
        watchdog.watch(far)
        near.begin()
        watchdog.watch(near)
        deadline = time.monotonic() + 5
        while not settled and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watchdog.stop(timeout=5)
    assert near.interrupt_reason is Interrupt.TIMEOUT
    assert settled == [(2, Ending.FAILED)]
    assert not far.interrupted


# ----------------------------------------------------------------- TTLs and instants


def test_a_ttl_past_the_maximum_is_refused_before_any_sql() -> None:
    with pytest.raises(InvalidOptionsError, match="365 days") as exc:
        UniqueOpts(ttl=dt.timedelta.max)
    assert exc.value.option == "ttl"
    assert UniqueOpts(ttl=MAX_TTL).ttl == MAX_TTL


@pytest.mark.parametrize(
    "scheduled_at",
    [
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),  # year 0 in UTC
        dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))),  # year 10000
        dt.datetime(9999, 12, 31, tzinfo=UTC),
        dt.datetime(1, 1, 1, tzinfo=UTC),
    ],
    ids=["year-0-utc", "year-10000-utc", "last-day", "first-day"],
)
def test_a_scheduled_at_python_could_not_read_back_is_refused(scheduled_at: dt.datetime) -> None:
    with pytest.raises(InvalidOptionsError, match="outside the instants") as exc:
        InsertOpts(scheduled_at=scheduled_at)
    assert exc.value.option == "scheduled_at"


def test_a_scheduled_at_whose_ttl_lock_would_end_out_of_range_is_refused() -> None:
    @sa_jobs.job_args(
        kind="bounds_ttl",
        registry=sa_jobs.KindRegistry(),
        unique=UniqueOpts(ttl=dt.timedelta(days=30)),
    )
    class Locked:
        n: int = 0

    late = LATEST_INSTANT - dt.timedelta(days=1)
    with pytest.raises(InvalidOptionsError, match="plus the unique ttl"):
        sa_jobs.insert_job(Locked(), scheduled_at=late)
    sa_jobs.insert_job(Locked(), scheduled_at=late - dt.timedelta(days=30))


# ----------------------------------------------------------------- nested documents


def nested(depth: int) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for _ in range(depth):
        document = {"a": document}
    return document


def test_deeply_nested_metadata_is_an_options_error_not_a_recursion_error() -> None:
    with pytest.raises(InvalidOptionsError, match="nested more than 100 levels"):
        InsertOpts(metadata=nested(5000))
    InsertOpts(metadata=nested(99))


def test_deeply_nested_args_are_an_args_error_not_a_recursion_error() -> None:
    @sa_jobs.job_args(kind="bounds_nested", registry=sa_jobs.KindRegistry())
    class Anything:
        payload: Any = None

    with pytest.raises(InvalidJobArgsError, match="nested more than 100 levels"):
        sa_jobs.insert_job(Anything(nested(5000)))
