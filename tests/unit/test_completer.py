"""Completers (:mod:`sa_jobs.worker.completer`) with a fake writer, without a database.

A completer takes outcomes from the threads that ran handlers and hands them to its
writer: :class:`BatchCompleter` collects them on a thread of its own and writes many at
once, :class:`InlineCompleter` writes each at once in the caller's thread. Both count an
outcome as pending until its write is over (the worker reports those jobs as still
held), and stopping is bounded even when the writer is stuck. The writer's own rules
(:class:`OutcomeWriter`: retries, one at a time, give up) need a database and are
covered by ``tests/integration/test_outcomes_never_stall.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from sa_jobs._base.records import Ending, Outcome
from sa_jobs.worker.completer import BatchCompleter, InlineCompleter, OutcomeWriter
from tests.helpers import eventually


def completed(job_id: int) -> Outcome:
    return Outcome(job_id, 1, Ending.COMPLETED)


class FakeWriter:
    """What a completer needs of an :class:`OutcomeWriter`: ``write`` and ``stopping``.

    Attributes:
        gate: While cleared, a write waits for it (or, with ``honours_stopping``, for
            ``stopping``, as the real writer stops retrying).
        raises: Exceptions the next writes raise, one each.
    """

    def __init__(self, *, honours_stopping: bool = True) -> None:
        self.stopping = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.honours_stopping = honours_stopping
        self.raises: list[Exception] = []
        self.writes: list[list[Outcome]] = []
        self.writing = threading.Event()
        self.threads: list[int] = []
        self.pending_seen: list[int] = []
        self.completer: InlineCompleter | BatchCompleter | None = None

    def write(self, batch: Sequence[Outcome]) -> None:
        self.threads.append(threading.get_ident())
        if self.completer is not None:
            self.pending_seen.append(self.completer.pending())
        self.writing.set()
        while not self.gate.wait(0.001):
            if self.honours_stopping and self.stopping.is_set():
                return  # given up: left to the rescuer
        if self.raises:
            raise self.raises.pop(0)
        self.writes.append(list(batch))

    @property
    def written(self) -> list[int]:
        return [outcome.job_id for batch in self.writes for outcome in batch]


def batch_completer(writer: FakeWriter, **options: float) -> BatchCompleter:
    completer = BatchCompleter(writer, **options)  # type: ignore[arg-type]
    writer.completer = completer
    return completer


@pytest.fixture
def cleanup() -> Iterator[list[tuple[FakeWriter, BatchCompleter]]]:
    """Completers a test started: unblocked and stopped at its end."""
    started: list[tuple[FakeWriter, BatchCompleter]] = []
    yield started
    for writer, completer in started:
        writer.gate.set()
        completer.stop(2)


def started(
    cleanup: list[tuple[FakeWriter, BatchCompleter]], writer: FakeWriter, **options: float
) -> BatchCompleter:
    completer = batch_completer(writer, **options)
    completer.start()
    cleanup.append((writer, completer))
    return completer


# --------------------------------------------------------------------------- batching


def test_outcomes_waiting_together_are_written_in_one_batch() -> None:
    writer = FakeWriter()
    completer = batch_completer(writer)
    for job_id in range(1, 11):
        completer.submit(completed(job_id))

    completer.start()
    completer.stop(2)

    assert [len(batch) for batch in writer.writes] == [10]
    assert writer.written == list(range(1, 11))


def test_a_stream_of_outcomes_takes_fewer_writes_than_outcomes_in_order(
    cleanup: list[tuple[FakeWriter, BatchCompleter]],
) -> None:
    writer = FakeWriter()
    completer = started(cleanup, writer, interval=0.02)

    for job_id in range(1, 51):
        completer.submit(completed(job_id))
    assert eventually(lambda: completer.pending() == 0)

    assert len(writer.writes) < 10
    assert writer.written == list(range(1, 51))
    assert threading.get_ident() not in writer.threads  # written on the completer's thread


def test_an_idle_completer_writes_at_once_and_a_busy_one_gathers_a_batch(
    cleanup: list[tuple[FakeWriter, BatchCompleter]],
) -> None:
    writer = FakeWriter()
    completer = started(cleanup, writer, interval=1.0)

    submitted = time.monotonic()
    completer.submit(completed(1))
    assert eventually(lambda: writer.written == [1])
    assert time.monotonic() - submitted < 0.5  # not held back for the interval
    # Right after a write it is busy: what comes now waits for the interval, together.
    for job_id in range(2, 12):
        completer.submit(completed(job_id))
    assert eventually(lambda: completer.pending() == 0, timeout=3)
    assert [len(batch) for batch in writer.writes] == [1, 10]
    assert time.monotonic() - submitted >= 1.0


def test_a_batch_holds_at_most_max_batch_outcomes() -> None:
    writer = FakeWriter()
    completer = batch_completer(writer, max_batch=3)
    for job_id in range(1, 8):
        completer.submit(completed(job_id))

    completer.start()
    completer.stop(2)

    assert [len(batch) for batch in writer.writes] == [3, 3, 1]
    assert writer.written == list(range(1, 8))


# --------------------------------------------------------------------------- pending


def test_outcomes_are_pending_until_their_write_is_over(
    cleanup: list[tuple[FakeWriter, BatchCompleter]],
) -> None:
    writer = FakeWriter()
    writer.gate.clear()
    completer = started(cleanup, writer)
    assert (completer.pending(), completer.pending_ids()) == (0, set())

    for job_id in (1, 2, 2):  # job 2: an outcome of an earlier run, and of this one
        completer.submit(completed(job_id))
    assert writer.writing.wait(2)  # taken from the queue, but not written yet

    assert completer.pending() == 3
    assert completer.pending_ids() == {1, 2}

    writer.gate.set()
    assert eventually(lambda: completer.pending() == 0)
    assert completer.pending_ids() == set()
    assert writer.written == [1, 2, 2]


def test_a_write_that_raises_is_logged_and_the_completer_goes_on(
    cleanup: list[tuple[FakeWriter, BatchCompleter]], caplog: pytest.LogCaptureFixture
) -> None:
    writer = FakeWriter()
    writer.raises = [RuntimeError("a bug in the writer")]
    completer = started(cleanup, writer)

    completer.submit(completed(1))
    assert eventually(lambda: completer.pending() == 0)
    completer.submit(completed(2))
    assert eventually(lambda: writer.written == [2])

    assert completer.running
    assert "unexpected error writing 1 outcomes" in caplog.text


# --------------------------------------------------------------------------- stop


def test_stop_writes_everything_submitted_before_it() -> None:
    writer = FakeWriter()
    completer = batch_completer(writer)
    completer.start()
    writer.gate.clear()
    completer.submit(completed(1))
    assert writer.writing.wait(2)
    for job_id in range(2, 6):  # while job 1's write is under way
        completer.submit(completed(job_id))
    threading.Timer(0.02, writer.gate.set).start()

    started_at = time.monotonic()
    completer.stop(2)

    assert time.monotonic() - started_at < 1
    assert writer.written == [1, 2, 3, 4, 5]
    assert completer.pending() == 0
    assert not completer.running
    assert not writer.stopping.is_set()  # it finished in time: nothing was given up


def test_stop_tells_a_stuck_writer_to_give_up_after_its_timeout() -> None:
    writer = FakeWriter(honours_stopping=True)
    writer.gate.clear()  # the database does not answer
    completer = batch_completer(writer)
    completer.start()
    completer.submit(completed(1))
    assert writer.writing.wait(2)

    started_at = time.monotonic()
    completer.stop(0.05)
    took = time.monotonic() - started_at

    assert 0.05 <= took < 0.5
    assert writer.stopping.is_set()
    assert not completer.running
    assert writer.written == []  # left to the rescuer
    assert completer.pending() == 0


def test_stop_returns_within_its_bound_even_when_the_writer_never_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = FakeWriter(honours_stopping=False)
    writer.gate.clear()
    completer = batch_completer(writer)
    completer.start()
    completer.submit(completed(1))
    assert writer.writing.wait(2)
    caplog.set_level(logging.ERROR, logger="sa_jobs.worker")

    started_at = time.monotonic()
    try:
        completer.stop(0.05)
        took = time.monotonic() - started_at
    finally:
        writer.gate.set()

    assert took < 0.05 + 1.0 + 0.3  # the timeout, plus one second to notice
    assert "the completer is still writing after 0.05 s" in caplog.text
    assert "1 outcomes are left to the rescuer" in caplog.text


def test_stopping_a_stopped_completer_returns_at_once() -> None:
    writer = FakeWriter()
    completer = batch_completer(writer)
    completer.start()
    completer.stop(2)

    started_at = time.monotonic()
    completer.stop(2)

    assert time.monotonic() - started_at < 0.1
    assert writer.writes == []


# --------------------------------------------------------------------------- inline


def test_the_inline_completer_writes_each_outcome_at_once_in_the_callers_thread() -> None:
    writer = FakeWriter()
    completer = InlineCompleter(writer)  # type: ignore[arg-type]
    writer.completer = completer
    completer.start()

    completer.submit(completed(1))
    assert writer.writes == [[completed(1)]]
    completer.submit(completed(2))

    assert writer.writes == [[completed(1)], [completed(2)]]  # no batching
    assert set(writer.threads) == {threading.get_ident()}
    assert writer.pending_seen == [1, 1]  # pending while written
    assert (completer.pending(), completer.pending_ids()) == (0, set())


def test_the_inline_completer_counts_an_outcome_out_even_if_its_write_raises() -> None:
    writer = FakeWriter()
    writer.raises = [RuntimeError("boom")]
    completer = InlineCompleter(writer)  # type: ignore[arg-type]

    with pytest.raises(RuntimeError, match="boom"):
        completer.submit(completed(1))

    assert completer.pending() == 0


def test_stopping_the_inline_completer_stops_its_writer_retrying() -> None:
    writer = FakeWriter()
    completer = InlineCompleter(writer)  # type: ignore[arg-type]

    completer.stop(1)

    assert writer.stopping.is_set()


def test_the_real_writer_has_what_the_completers_use() -> None:
    # The fake stands in for OutcomeWriter: keep the two in step.
    assert callable(OutcomeWriter.write)
    writer = OutcomeWriter(None, features=None, give_up_after=1)  # type: ignore[arg-type]
    assert isinstance(writer.stopping, threading.Event)
