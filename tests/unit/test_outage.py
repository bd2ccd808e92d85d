"""The outage log: one line when database operations start failing, one when they work
again (with how long and how many retries), DEBUG in between; its end wakes whoever
asked."""

from __future__ import annotations

import logging
import re
import time

import pytest
from sqlalchemy.exc import OperationalError

from sa_jobs.worker import producer as producer_module
from sa_jobs.worker.outage import OutageLog
from sa_jobs.worker.service import Backoff
from tests.helpers import eventually
from tests.unit.test_producer import FakeQueue, a_producer


def test_an_outage_is_two_warnings_however_many_operations_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sa_jobs.worker")
    outage = OutageLog(settle=0)
    ended: list[int] = []
    outage.on_end(lambda: ended.append(outage.ended))

    outage.succeeded()  # no outage: says nothing
    assert caplog.records == []
    for _ in range(30):
        outage.failed("fetch", "fetching from queue 'q' failed: connection refused")
    for _ in range(12):
        outage.failed("maintenance", "maintenance step heartbeat failed: refused")
    assert outage.ongoing
    assert ended == []
    outage.succeeded()
    outage.succeeded()  # already over: nothing more

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "fetching from queue 'q' failed: connection refused" in warnings[0]
    assert re.search(
        r"succeed again after \d+\.\d s; 42 failed operations were retried meanwhile "
        r"\(fetch 30, maintenance 12\)",
        warnings[1],
    ), warnings[1]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 41
    assert ended == [1]
    assert not outage.ongoing


def test_a_second_outage_starts_afresh(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sa_jobs.worker")
    outage = OutageLog(settle=0)
    for round_ in range(2):
        outage.failed("listen", f"listen connection lost ({round_})")
        outage.failed("listen", "again")
        outage.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4
    assert "listen connection lost (1)" in messages[2]
    assert "2 failed operations were retried meanwhile (listen 2)" in messages[3]
    assert outage.ended == 2


def test_a_failing_end_callback_is_logged_and_the_outage_still_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog(settle=0)

    def broken() -> None:
        raise RuntimeError("bug")

    outage.on_end(broken)
    outage.failed("fetch", "refused")
    outage.succeeded()
    assert not outage.ongoing
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)


def test_the_end_of_an_outage_cuts_a_producers_backoff_short(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sa_jobs.worker")
    monkeypatch.setattr(producer_module, "Backoff", lambda: Backoff(first=30.0, cap=30.0))
    fake = FakeQueue(due=1)
    fake.failures = [OperationalError("SELECT", {}, Exception("connection refused"))]
    outage = OutageLog(settle=0)
    producer = a_producer(fake, concurrency=1, poll_interval=30.0)
    producer.outage = outage
    outage.on_end(producer.wake)  # as the worker does (it wakes every producer)
    producer.start()
    try:
        producer.wake()  # the first fetch, which fails: a 30 s backoff
        assert eventually(lambda: len(fake.limits) == 1)
        assert outage.ongoing
        time.sleep(0.05)
        started = time.monotonic()
        outage.succeeded()  # another thread reached the database
        assert eventually(lambda: fake.dispatched == [1], timeout=2)
        assert time.monotonic() - started < 1.0
    finally:
        producer.stopping.set()
        producer.wake()
        producer.join(2)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "fetching from queue" in messages[0] and "fetch 1" in messages[1]


def test_a_success_right_after_the_first_failure_does_not_end_the_outage() -> None:
    # A statement under way when another thread failed reports success a moment later;
    # the outage goes on until a success after `settle`.
    outage = OutageLog(settle=0.2)
    outage.failed("listen", "listen connection lost")
    outage.succeeded()
    assert outage.ongoing
    time.sleep(0.25)
    outage.succeeded()
    assert not outage.ongoing
    assert outage.ended == 1
