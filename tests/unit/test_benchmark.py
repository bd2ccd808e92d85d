"""The benchmark's arithmetic: how jobs are batched over queues, percentiles, ratios and
the table, a worker process that dies — without a database."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url

from sa_jobs.benchmark import Figure, Report
from sa_jobs.benchmark.children import drain, percentile
from sa_jobs.benchmark.run import batches
from sa_jobs.errors import BenchmarkError


def test_batches_spread_jobs_evenly_over_queues_in_bounded_contiguous_runs() -> None:
    chunks = batches(2_501, ["a", "b"], 1_000)
    assert [(queue, seqs.start, seqs.stop) for queue, seqs in chunks] == [
        ("a", 0, 1_000),
        ("a", 1_000, 1_251),
        ("b", 1_251, 2_251),
        ("b", 2_251, 2_501),
    ]


def test_batches_number_every_job_once_whatever_the_split() -> None:
    for jobs, queues, size in [(1, 3, 1_000), (7, 3, 2), (10_000, 1, 1_000), (5, 2, 1)]:
        chunks = batches(jobs, [f"q{i}" for i in range(queues)], size)
        seqs = [seq for _, run in chunks for seq in run]
        assert seqs == list(range(jobs))
        assert all(0 < len(run) <= size for _, run in chunks)


def test_percentiles_interpolate_like_the_standard_librarys_inclusive_method() -> None:
    values = [0.9, 0.1, 0.5, 0.3, 0.7, 2.0, 0.2]
    quantiles = statistics.quantiles(values, n=100, method="inclusive")
    for q in (50, 90, 99):
        assert percentile(values, q) == pytest.approx(quantiles[q - 1])
    assert percentile([4.0], 99) == 4.0


def test_a_figures_ratio_is_its_value_over_the_floors_and_absent_without_a_floor() -> None:
    assert Figure("worked", "worked", "jobs/s", 300.0, 1_200.0).ratio == 0.25
    assert Figure("worked", "worked", "jobs/s", 300.0).ratio is None


def test_the_table_shows_floor_and_ratio_columns_only_when_a_floor_was_measured() -> None:
    with_floor = Report({}, {}, [Figure("lat", "latency p50", "ms", 3.0, 1.5, False)])
    lines = with_floor.render().splitlines()
    assert lines[0].split() == ["sa_jobs", "floor", "ratio"]
    assert lines[1].split() == ["latency", "p50", "3.00", "ms", "1.50", "ms", "2.00x"]
    without = Report({}, {}, [Figure("lat", "latency p50", "ms", 3.0)]).render()
    header, row = without.splitlines()
    assert header.split() == ["sa_jobs"]
    assert row == "latency p50  3.00 ms"


def dies(*_args: Any) -> None:
    """A worker process target that fails before it is ready (module level: spawned)."""
    raise SystemExit(3)


def test_a_worker_process_that_dies_is_reported_at_once_not_waited_for() -> None:
    nowhere = make_url("postgresql+psycopg://nobody@127.0.0.1:1/nowhere")  # never reached
    with pytest.raises(BenchmarkError, match=r"worker process died \(exit code 3\)"):
        drain(nowhere, create_engine(nowhere), dies, 2, {"default": 1}, "sync", 10)
