"""Limits are checked where they are built, and against the worker's queues when it is
constructed: no database, nothing written."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import create_engine

import sa_jobs
from sa_jobs import ConcurrencyLimit, RateLimit, Worker
from sa_jobs._act.by_filter import JobFilter
from sa_jobs._declare.limits import LimitScope
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.limited_fetch import WINDOWS_PER_PERIOD, plan_limits, window_of
from tests.doc_recipes import load_recipe

ENGINE = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/never")


@sa_jobs.job_args(kind="unit_limits_mail")
class SendMail:
    to: str = ""


class NotArgs:
    pass


def test_a_kind_limit_takes_the_args_class_or_its_kind() -> None:
    assert ConcurrencyLimit(kind=SendMail, max_running=2).kind == "unit_limits_mail"
    assert ConcurrencyLimit(kind="unit_limits_mail", max_running=2).scope == LimitScope(
        "kind", "unit_limits_mail"
    )
    assert RateLimit(queue="api", max_starts=5, per=60).per == dt.timedelta(minutes=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "q", "max_running": 0}, "max_running: must be an int from 1"),
        ({"queue": "q", "max_running": -3}, "max_running: must be an int from 1"),
        ({"queue": "q", "max_running": 2.0}, "max_running: must be an int from 1"),
        ({"queue": "q", "max_running": True}, "max_running: must be an int from 1"),
        ({"max_running": 1}, "exactly one of queue= or kind="),
        ({"queue": "q", "kind": "k", "max_running": 1}, "exactly one of queue= or kind="),
        ({"queue": "", "max_running": 1}, "queue: must be a non-empty string"),
        ({"kind": NotArgs, "max_running": 1}, "NotArgs is not a job args class"),
        ({"kind": "", "max_running": 1}, "kind: must be a job args class or a kind"),
    ],
)
def test_bad_concurrency_limits_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        ConcurrencyLimit(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "q", "max_starts": 0, "per": 1}, "max_starts: must be an int from 1"),
        ({"queue": "q", "max_starts": 5, "per": 0.5}, "per: must be from 1 second to 365 days"),
        ({"queue": "q", "max_starts": 5, "per": dt.timedelta(0)}, "per: must be from 1 second"),
        ({"queue": "q", "max_starts": 5, "per": -60}, "per: must be from 1 second"),
        ({"queue": "q", "max_starts": 5, "per": float("inf")}, "per: must be finite"),
        ({"queue": "q", "max_starts": 5, "per": "1m"}, "per: must be a timedelta or seconds"),
        ({"queue": "q", "max_starts": 5, "per": dt.timedelta(days=400)}, "365 days"),
        ({"max_starts": 5, "per": 60}, "exactly one of queue= or kind="),
    ],
)
def test_bad_rate_limits_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        RateLimit(**options)


def test_a_limit_on_a_queue_the_worker_does_not_serve_is_refused() -> None:
    with pytest.raises(InvalidOptionsError, match="queue 'mail', which this worker does not"):
        Worker(
            ENGINE, queues={"default": 5}, limits=[ConcurrencyLimit(queue="mail", max_running=1)]
        )
    with pytest.raises(InvalidOptionsError, match="queue 'api', which this worker does not"):
        Worker(ENGINE, queues={"default": 5}, limits=[RateLimit(queue="api", max_starts=1, per=1)])


def test_two_limits_of_one_type_on_one_scope_are_refused() -> None:
    limits = [
        ConcurrencyLimit(kind=SendMail, max_running=1),
        ConcurrencyLimit(kind="unit_limits_mail", max_running=2),
    ]
    with pytest.raises(InvalidOptionsError, match="two ConcurrencyLimits for kind"):
        Worker(ENGINE, limits=limits)


@pytest.mark.parametrize("limits", [[object()], ConcurrencyLimit(queue="default", max_running=1)])
def test_limits_must_be_a_list_of_limits(limits: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="limits"):
        Worker(ENGINE, limits=limits)


def test_the_queues_of_a_limited_worker_keep_its_limited_queues() -> None:
    worker = Worker(
        ENGINE, queues={"mail": 2}, limits=[ConcurrencyLimit(queue="mail", max_running=1)]
    )
    with pytest.raises(InvalidOptionsError, match="queue 'mail'"):
        worker.queues = {"default": 2}
    worker.queues = {"mail": 4, "default": 2}
    assert worker.limits == (ConcurrencyLimit(queue="mail", max_running=1),)


def test_a_queue_and_a_rate_limit_on_one_scope_are_one_rule() -> None:
    plans = plan_limits(
        [
            ConcurrencyLimit(queue="mail", max_running=3),
            RateLimit(queue="mail", max_starts=10, per=60),
            ConcurrencyLimit(kind=SendMail, max_running=1),
        ],
        ["mail", "default"],
    )
    assert set(plans) == {"mail", "default"}  # a kind limit reaches every queue
    mail = {rule.scope.key: rule for rule in plans["mail"].rules}
    assert mail["queue:mail"].max_running == 3
    assert mail["queue:mail"].max_starts == 10
    assert [rule.scope.key for rule in plans["default"].rules] == ["kind:unit_limits_mail"]
    assert plan_limits([ConcurrencyLimit(queue="mail", max_running=3)], ["other"]) == {}


def test_rate_windows_are_a_twentieth_of_the_period_and_contain_their_instant() -> None:
    per = dt.timedelta(minutes=1)
    at = dt.datetime(2026, 3, 29, 1, 59, 59, 999_999, tzinfo=dt.UTC)
    start, end = window_of(at, per)
    assert end - start == per / WINDOWS_PER_PERIOD
    assert start <= at < end
    assert window_of(end, per)[0] == end


def test_the_docs_recipe_declares_three_limits() -> None:
    recipe = load_recipe("queues.md", "Limits")
    assert [type(limit).__name__ for limit in recipe.worker.limits] == [
        "ConcurrencyLimit",
        "ConcurrencyLimit",
        "RateLimit",
    ]
    assert recipe.worker.limits[1].kind == "newsletter.send_email"


@pytest.mark.parametrize("kind", [NotArgs, NotArgs(), "", "   ", "k" * 200, "nul\x00"])
def test_a_bad_kind_gets_the_same_error_from_a_limit_and_a_bulk_filter(kind: object) -> None:
    # One resolver (sa_jobs._declare.args.check_kind) for every option that names a kind.
    with pytest.raises(InvalidOptionsError) as from_limit:
        ConcurrencyLimit(kind=kind, max_running=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionsError) as from_filter:
        JobFilter.build("delete", kind=kind)  # type: ignore[arg-type]
    assert str(from_limit.value) == str(from_filter.value)
    assert str(from_limit.value).startswith("kind: ")
