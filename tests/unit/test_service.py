"""The lifecycle every background thread of the worker shares, and its backoff.

A :class:`Service` runs :meth:`~Service.run_loop` on a daemon thread until its
``stopping`` event is set; each pass of the loop is counted, and
:meth:`~Service.wait_passes` lets a caller (a test) wait for further passes instead of
sleeping. A bug in a loop is logged, never raised into the worker. :class:`Backoff`
spaces out retries: doubling from ``first`` to ``cap``, ±20% jitter, reset by a success.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from sa_jobs.worker.service import Backoff, Service


class Ticker(Service):
    """A service that makes a pass every ``every`` seconds until it is stopped."""

    def __init__(self, every: float = 0.005, stopping: threading.Event | None = None) -> None:
        super().__init__("ticker", stopping)
        self.every = every
        self.thread_names: set[str] = set()

    def run_loop(self) -> None:
        while not self.stopping.is_set():
            self.thread_names.add(threading.current_thread().name)
            self.stopping.wait(self.every)
            self.passed()


class Crashes(Service):
    def __init__(self) -> None:
        super().__init__("crasher")

    def run_loop(self) -> None:
        self.passed()
        raise RuntimeError("a bug in the loop")


class Deaf(Service):
    """A service whose loop ignores ``stopping`` until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__("deaf")
        self.release = threading.Event()

    def run_loop(self) -> None:
        self.release.wait(5)


# --------------------------------------------------------------------------- Service


def test_a_service_runs_its_loop_on_a_named_daemon_thread_until_stopped() -> None:
    ticker = Ticker()
    assert not ticker.running

    ticker.start()
    assert ticker.running
    assert ticker.wait_passes(2, timeout=2)
    [thread] = [t for t in threading.enumerate() if t.name == "sa_jobs-ticker"]
    ticker.stop(timeout=2)

    assert not ticker.running
    assert not thread.is_alive()
    assert thread.daemon  # a stuck loop never keeps the process alive
    assert ticker.stopping.is_set()
    assert ticker.thread_names == {"sa_jobs-ticker"}


def test_wait_passes_waits_for_that_many_further_passes() -> None:
    ticker = Ticker(every=0.02)
    ticker.start()
    try:
        started = time.monotonic()
        assert ticker.wait_passes(3, timeout=2)
        took = time.monotonic() - started
    finally:
        ticker.stop(timeout=2)

    assert took >= 2 * 0.02  # at least two full passes after the call (the first may be a part)


def test_wait_passes_says_false_when_the_passes_do_not_come() -> None:
    ticker = Ticker(every=10)
    ticker.start()
    try:
        started = time.monotonic()
        assert not ticker.wait_passes(1, timeout=0.05)
        assert time.monotonic() - started >= 0.05
    finally:
        ticker.stop(timeout=2)


def test_services_sharing_a_stopping_event_stop_together() -> None:
    stopping = threading.Event()
    first, second = Ticker(stopping=stopping), Ticker(stopping=stopping)
    first.start()
    second.start()

    stopping.set()
    first.join(2)
    second.join(2)

    assert not first.running
    assert not second.running


def test_an_exception_in_the_loop_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="sa_jobs.worker")
    crasher = Crashes()
    hooked: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, hooked.append
    try:
        crasher.start()
        crasher.join(2)
    finally:
        threading.excepthook = previous

    assert not crasher.running
    assert hooked == []  # nothing escaped the thread
    [record] = [r for r in caplog.records if "crasher" in r.getMessage()]
    assert record.getMessage() == "the crasher thread stopped on an unexpected error"
    assert record.exc_info is not None
    assert "a bug in the loop" in str(record.exc_info[1])


def test_joining_a_loop_that_does_not_end_gives_up_after_the_timeout_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deaf = Deaf()
    deaf.start()
    try:
        started = time.monotonic()
        deaf.stop(timeout=0.05)
        took = time.monotonic() - started
        assert deaf.running
    finally:
        deaf.release.set()
        deaf.join(2)

    assert 0.05 <= took < 0.5
    assert "the deaf thread did not end within 0.05 s" in caplog.text


def test_joining_a_service_that_never_started_returns_at_once() -> None:
    ticker = Ticker()
    started = time.monotonic()
    ticker.join(5)
    ticker.stop(5)
    assert time.monotonic() - started < 0.1


# --------------------------------------------------------------------------- Backoff


@pytest.fixture
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: (low + high) / 2)


@pytest.mark.usefixtures("no_jitter")
def test_backoff_doubles_from_first_up_to_the_cap() -> None:
    backoff = Backoff(first=0.1, cap=1.0)
    waits = [backoff.next_wait() for _ in range(7)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff.failures == 7


@pytest.mark.usefixtures("no_jitter")
def test_a_success_resets_the_backoff() -> None:
    backoff = Backoff(first=0.5, cap=10.0)
    for _ in range(4):
        backoff.next_wait()

    backoff.reset()

    assert backoff.failures == 0
    assert backoff.next_wait() == pytest.approx(0.5)


@pytest.mark.usefixtures("no_jitter")
def test_the_default_backoff_starts_at_a_tenth_of_a_second_and_caps_at_five() -> None:
    backoff = Backoff()
    waits = [backoff.next_wait() for _ in range(10)]
    assert waits[0] == pytest.approx(0.1)
    assert max(waits) == pytest.approx(5.0)


def test_backoff_jitter_stays_within_twenty_percent_and_is_really_random() -> None:
    seen = []
    for _ in range(500):
        backoff = Backoff(first=1.0, cap=8.0)
        seen.append([backoff.next_wait() for _ in range(5)])

    for step, base in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        column = [waits[step] for waits in seen]
        assert all(0.8 * base <= wait <= 1.2 * base for wait in column)
        assert min(column) < 0.85 * base  # spread over the whole range, not fixed
        assert max(column) > 1.15 * base
