"""What the insert-time args check costs, against the inserts measured in the same run.

Every insert reads its args back as the worker will (:mod:`sa_jobs._declare.args_check`): the
stored JSON is structured back with the kind's converter, written out again and
compared. That is pure CPU, so it is timed directly — many calls, the fastest of a few
rounds — rather than as the difference of two insert rates, whose noise on a shared
machine is larger than the check. It is timed on the benchmark's own args
(``{"seq": n}``) and on a typical args class (nine fields: text, numbers, an aware
datetime, a UUID, a list, an optional and a nested class), and each time is set against
the per-job time of the single and bulk enqueues of the same run.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable

import attrs

import sa_jobs
from sa_jobs._declare.args import kind_of
from sa_jobs._declare.args_check import check_reads_back
from sa_jobs.benchmark.noop import BenchNoop
from sa_jobs.benchmark.report import Figure

__all__ = ["BenchAddress", "BenchTypical", "check_seconds", "figures"]

#: Checks per timed round, and rounds (the fastest round counts: interruptions only add).
CALLS = 2_000
ROUNDS = 5


@attrs.frozen
class BenchAddress:
    street: str
    city: str
    postcode: str


@sa_jobs.job_args(kind="sa_jobs_bench_typical")
class BenchTypical:
    """Args as an application's job might carry them; never inserted, only checked."""

    user_id: int
    email: str
    template: str
    send_at: dt.datetime
    request_id: uuid.UUID
    tags: list[str]
    score: float
    address: BenchAddress
    note: str | None = None


def typical_args() -> BenchTypical:
    return BenchTypical(
        user_id=123_456,
        email="ada@example.com",
        template="welcome",
        send_at=dt.datetime(2030, 5, 1, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        request_id=uuid.UUID(int=0x5A10B5),
        tags=["signup", "eu"],
        score=0.75,
        address=BenchAddress("1 Main St", "Lyon", "69001"),
    )


def check_seconds(args: object) -> float:
    """Seconds one check of ``args`` takes: the fastest round of :data:`CALLS` calls."""
    kind = kind_of(args)
    converter = kind.converter.cattrs
    cls = type(args)
    data = converter.unstructure(args, unstructure_as=cls)

    def one() -> None:
        check_reads_back(converter, cls, data, args)

    return _fastest(one)


def _fastest(step: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(CALLS):
            step()
        best = min(best, (time.perf_counter() - started) / CALLS)
    return best


def figures(single_rate: float, bulk_rate: float) -> list[Figure]:
    """The check's time per insert, and its share of a single and of a bulk enqueue
    (``single_rate`` and ``bulk_rate`` in jobs/s, measured in the same run)."""
    noop = check_seconds(BenchNoop(123_456))
    typical = check_seconds(typical_args())
    single = 1 / single_rate
    bulk = 1 / bulk_rate
    return [
        Figure("args_check", "args check per insert, the benchmark's args", "us", noop * 1e6),
        Figure(
            "args_check_typical",
            "args check per insert, typical args (9 fields, nested)",
            "us",
            typical * 1e6,
        ),
        Figure(
            "args_check_share",
            "args check (typical args) / single enqueue",
            "%",
            100 * typical / single,
            higher_is_better=False,
        ),
        Figure(
            "args_check_bulk_share",
            "args check (benchmark's args) / a job of bulk enqueue",
            "%",
            100 * noop / bulk,
            higher_is_better=False,
        ),
    ]
