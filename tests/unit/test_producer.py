"""A queue's producer (:class:`sa_jobs.worker.producer.Producer`) with a fake fetch.

The producer keeps one queue's slots busy: it asks ``fetch(queue, limit)`` for at most
as many jobs as it has free slots, hands each to ``dispatch``, and fetches again when a
slot is released, when woken, or when its poll interval passes. A fetch that fails is
retried with backoff; the producer never dies of it. ``drained`` tells a worker that
works until idle when the queue had nothing more and nothing of it is running.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.exc import OperationalError

from sa_jobs._table.models import Job
from sa_jobs.worker import producer as producer_module
from sa_jobs.worker.producer import Producer
from sa_jobs.worker.service import Backoff
from tests.helpers import eventually

QUEUE = "q"


class FakeQueue:
    """``fetch`` and ``dispatch`` over a list of due jobs, recording every call.

    Attributes:
        failures: Exceptions the next fetches raise, one each, before fetching again.
        gate: While cleared, a fetch waits for it.
    """

    def __init__(self, due: int = 0) -> None:
        self._lock = threading.Lock()
        self._next_id = 1
        self.due: list[Job] = []
        self.add(due)
        self.limits: list[int] = []
        self.times: list[float] = []
        self.dispatched: list[int] = []
        self.failures: list[Exception] = []
        #: The positions in ``limits`` of the fetches that raised.
        self.failed_at: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def add(self, count: int) -> None:
        with self._lock:
            for _ in range(count):
                self.due.append(Job(id=self._next_id, kind="producer.work", queue=QUEUE))
                self._next_id += 1

    def fetch(self, queue: str, limit: int) -> list[Job]:
        assert queue == QUEUE
        self.gate.wait(5)
        with self._lock:
            self.limits.append(limit)
            self.times.append(time.monotonic())
            if self.failures:
                self.failed_at.append(len(self.limits) - 1)
                raise self.failures.pop(0)
            jobs, self.due = self.due[:limit], self.due[limit:]
            return jobs

    def dispatch(self, jobs: list[Job]) -> None:
        with self._lock:
            self.dispatched.extend(job.id for job in jobs)


def a_producer(
    fake: FakeQueue,
    concurrency: int,
    *,
    poll_interval: float = 0.01,
    dispatch: Callable[[list[Job]], None] | None = None,
    stopping: threading.Event | None = None,
) -> Producer:
    return Producer(
        QUEUE,
        concurrency,
        fetch=fake.fetch,
        dispatch=dispatch or fake.dispatch,
        poll_interval=poll_interval,
        stopping=stopping or threading.Event(),
    )


@pytest.fixture
def running() -> Iterator[Callable[[Producer], Producer]]:
    """Start producers; stop them at the end of the test."""
    started: list[Producer] = []

    def start(producer: Producer) -> Producer:
        producer.start()
        started.append(producer)
        return producer

    yield start
    for producer in started:
        producer.stopping.set()
        producer.wake()
    for producer in started:
        producer.join(2)


# --------------------------------------------------------------------------- free slots


def test_a_producer_never_fetches_more_than_its_free_slots(
    running: Callable[[Producer], Producer],
) -> None:
    fake = FakeQueue(due=10)
    producer = running(a_producer(fake, concurrency=3))

    assert eventually(lambda: len(fake.dispatched) == 3)
    assert producer.wait_passes(5)  # several polls, all with every slot taken

    assert fake.limits == [3]
    assert fake.dispatched == [1, 2, 3]
    assert producer.free == 0


def test_release_frees_a_slot_and_wakes_the_producer_at_once(
    running: Callable[[Producer], Producer],
) -> None:
    fake = FakeQueue(due=5)
    producer = running(a_producer(fake, concurrency=2, poll_interval=30))
    producer.wake()
    assert eventually(lambda: fake.dispatched == [1, 2])

    producer.release()

    assert eventually(lambda: fake.dispatched == [1, 2, 3], timeout=1)  # not after 30 s
    assert fake.limits == [2, 1]
    assert producer.free == 0


def test_a_busy_producer_fetches_once_half_its_slots_are_free_not_after_a_fixed_pause(
    running: Callable[[Producer], Producer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cooldown lets slots accumulate for a fuller batch; with a fixed pause, fast
    # handlers sat idle for it on every batch (a sync no-op drain ran at ~0.35x the floor,
    # 0.6x without). Half the slots free is batch enough: the fetch goes at once.
    monkeypatch.setattr(producer_module, "FETCH_COOLDOWN", 30.0)
    fake = FakeQueue(due=100)
    releasing: list[Producer] = []

    def dispatch(jobs: list[Job]) -> None:
        fake.dispatch(jobs)
        # Fast handlers: each slot comes back a few milliseconds later, from another
        # thread, as a completion would.
        for _ in jobs:
            threading.Timer(0.01, releasing[0].release).start()

    producer = a_producer(fake, concurrency=10, poll_interval=30, dispatch=dispatch)
    releasing.append(producer)
    running(producer)
    producer.wake()

    assert eventually(lambda: len(fake.limits) >= 5, timeout=2)  # not one per 30 s
    assert all(limit >= 5 for limit in fake.limits)  # still batches, not one job each


def test_a_busy_producer_still_fetches_what_is_free_once_the_cooldown_passes(
    running: Callable[[Producer], Producer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_module, "FETCH_COOLDOWN", 0.05)
    fake = FakeQueue(due=20)
    producer = running(a_producer(fake, concurrency=10, poll_interval=30))
    producer.wake()
    assert eventually(lambda: fake.limits == [10])

    producer.release()  # one slot of ten: less than half, so wait the cooldown

    assert eventually(lambda: fake.limits == [10, 1], timeout=2)
    assert fake.times[1] - fake.times[0] >= 0.05


def test_under_load_running_jobs_never_exceed_the_slots(
    running: Callable[[Producer], Producer],
) -> None:
    fake = FakeQueue(due=60)
    lock = threading.Lock()
    now_running = [0]
    most_running = [0]
    finished: list[int] = []
    limits_over_free: list[tuple[int, int]] = []
    producer: Producer | None = None

    def fetch(queue: str, limit: int) -> list[Job]:
        assert producer is not None
        free = producer.free  # slots only ever grow under a fetch, never shrink
        if limit > free:
            limits_over_free.append((limit, free))
        return fake.fetch(queue, limit)

    def run_then_release(job: Job) -> None:
        time.sleep(random.uniform(0, 0.003))
        with lock:
            now_running[0] -= 1
            finished.append(job.id)
        assert producer is not None
        producer.release()

    def dispatch(jobs: list[Job]) -> None:
        for job in jobs:
            with lock:
                now_running[0] += 1
                most_running[0] = max(most_running[0], now_running[0])
            threading.Thread(target=run_then_release, args=(job,), daemon=True).start()

    producer = Producer(
        QUEUE, 4, fetch=fetch, dispatch=dispatch, poll_interval=0.01, stopping=threading.Event()
    )
    running(producer)

    assert eventually(lambda: len(finished) == 60, timeout=5)
    assert most_running[0] == 4
    assert limits_over_free == []
    assert sorted(finished) == list(range(1, 61))
    assert eventually(lambda: producer.free == 4)


# --------------------------------------------------------------------------- failing fetches


def test_a_failing_fetch_is_retried_with_growing_backoff_and_the_producer_keeps_going(
    running: Callable[[Producer], Producer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sa_jobs.worker")
    fake = FakeQueue(due=2)
    lost = OperationalError("SELECT", {}, Exception("server closed the connection"))
    fake.failures = [lost, RuntimeError("relation sa_job is locked")]
    producer = running(a_producer(fake, concurrency=2))

    assert eventually(lambda: fake.dispatched == [1, 2])

    first_wait = fake.times[1] - fake.times[0]
    second_wait = fake.times[2] - fake.times[1]
    assert first_wait >= 0.08  # Backoff(0.1) with -20% jitter at most
    assert second_wait >= 0.16  # doubled
    assert producer.running
    failures = [r for r in caplog.records if "fetching from queue 'q' failed" in r.getMessage()]
    # A lost connection is a warning; anything else is an error.
    assert [r.levelno for r in failures] == [logging.WARNING, logging.ERROR]
    assert "relation sa_job is locked" in failures[1].getMessage()


def test_a_successful_fetch_resets_the_backoff(running: Callable[[Producer], Producer]) -> None:
    fake = FakeQueue()
    fake.failures = [RuntimeError("one"), RuntimeError("two")]
    producer = running(a_producer(fake, concurrency=1))
    assert eventually(lambda: len(fake.limits) >= 3)  # two failures, then a success

    fake.failures.append(RuntimeError("three"))
    assert eventually(lambda: len(fake.failed_at) == 3)
    third = fake.failed_at[2]
    assert eventually(lambda: len(fake.limits) > third + 1)

    assert fake.failed_at[:2] == [0, 1]
    assert third > 2  # a success came between the second failure and the third
    after_reset = fake.times[third + 1] - fake.times[third]
    assert after_reset < 0.3  # ~0.1 s again, not the 0.4 s a third failure in a row waits
    assert producer.running


# --------------------------------------------------------------------------- drained


def test_a_queue_is_drained_once_a_fetch_finds_nothing_and_nothing_runs(
    running: Callable[[Producer], Producer],
) -> None:
    fake = FakeQueue(due=1)
    producer = a_producer(fake, concurrency=2)
    assert not producer.drained  # nothing was fetched yet
    running(producer)

    assert eventually(lambda: fake.dispatched == [1])
    assert producer.wait_passes(3)  # empty fetches, but job 1 still runs
    assert not producer.drained

    producer.release()

    assert eventually(lambda: producer.drained)


def test_waking_a_drained_producer_makes_it_look_again(
    running: Callable[[Producer], Producer],
) -> None:
    fake = FakeQueue()
    producer = running(a_producer(fake, concurrency=1, poll_interval=30))
    producer.wake()
    assert eventually(lambda: producer.drained)

    fake.gate.clear()  # the next fetch waits, so its answer cannot come before we look
    fake.add(1)
    producer.wake()

    assert not producer.drained
    fake.gate.set()
    assert eventually(lambda: fake.dispatched == [1])
    assert not producer.drained  # job 1 is running


# --------------------------------------------------------------------------- stopping


def test_a_producer_stops_when_its_stopping_event_is_set(
    running: Callable[[Producer], Producer],
) -> None:
    stopping = threading.Event()  # shared with the other services of a worker run
    fake = FakeQueue()
    producer = running(a_producer(fake, concurrency=1, poll_interval=0.05, stopping=stopping))
    assert producer.wait_passes(1)

    stopping.set()

    assert eventually(lambda: not producer.running, timeout=0.5)
    fetches = len(fake.limits)
    fake.add(3)
    producer.wake()
    time.sleep(0.02)
    assert len(fake.limits) == fetches
    assert fake.dispatched == []


def test_stopping_cuts_a_backoff_wait_short(
    running: Callable[[Producer], Producer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_module, "Backoff", lambda: Backoff(first=30.0, cap=30.0))
    fake = FakeQueue()
    fake.failures = [RuntimeError("down")]
    producer = running(a_producer(fake, concurrency=1))
    assert eventually(lambda: len(fake.limits) == 1)
    time.sleep(0.01)  # into its 30 s backoff

    started = time.monotonic()
    producer.stopping.set()
    producer.join(2)

    assert not producer.running
    assert time.monotonic() - started < 0.5


def test_a_producer_with_many_slots_fills_them_in_batches_of_at_most_the_fetch_maximum(
    running: Callable[[Producer], Producer],
) -> None:
    # Hundreds of jobs handed off at once wake as many handler threads at once, which then
    # queue for the GIL ahead of the producer and the completer: a worker with 500 slots
    # drained slower than one with 200. Its batches are capped; its slots still fill.
    fake = FakeQueue(due=1_000)
    producer = running(a_producer(fake, concurrency=500, poll_interval=30))
    producer.wake()

    assert eventually(lambda: producer.free == 0)
    assert fake.limits == [producer_module.FETCH_BATCH_MAX] * 5
    assert producer_module.FETCH_BATCH_MAX == 100
