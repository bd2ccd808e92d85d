"""Periodic jobs across real processes: several ticking at once insert exactly one job per
instant, and processes killed with SIGKILL between inserting an instant's job and
committing leave that instant to be fired once by another."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import signal

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sa_jobs import Job
from sa_jobs.models import PeriodicState
from tests.acceptance.conftest import Spawn
from tests.acceptance.periodic_app import NAME
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

APP = "tests.acceptance.periodic_app"
SECOND = dt.timedelta(seconds=1)


def fired_instants(engine: Engine) -> list[dt.datetime]:
    with Session(engine) as session:
        jobs = session.scalars(select(Job).where(Job.kind == "acceptance_periodic")).all()
        return sorted(dt.datetime.fromisoformat(j.metadata_["periodic"]["instant"]) for j in jobs)


def assert_one_job_per_instant(instants: list[dt.datetime]) -> None:
    assert len(instants) == len(set(instants)), "an instant got two jobs"
    gaps = {b - a for a, b in itertools.pairwise(instants)}
    assert gaps == {SECOND}, f"an instant was skipped: gaps {gaps}"


def next_fire(engine: Engine) -> dt.datetime:
    with Session(engine) as session:
        row = session.get(PeriodicState, NAME)
        assert row is not None
        return row.next_run_at


def test_several_processes_ticking_at_once_insert_one_job_per_instant(
    engine: Engine, spawn: Spawn
) -> None:
    workers = [spawn(f"periodic-{n}", app=APP) for n in range(3)]
    for worker in workers:
        worker.wait_ready(engine)
    wait_until(lambda: len(fired_instants(engine)) >= 6, timeout=20, what="six instants")
    for worker in workers:
        assert worker.stop() == 0
    instants = fired_instants(engine)
    assert_one_job_per_instant(instants)
    # They really competed: more than one process inserted jobs.
    inserting = [w for w in workers if re.search(r"periodic jobs: \d+ job", w.output())]
    assert len(inserting) >= 2, "only one process ever fired; the test proved nothing"


def test_killing_processes_mid_tick_neither_skips_nor_doubles_an_instant(
    engine: Engine, spawn: Spawn
) -> None:
    steady = spawn("periodic-steady", app=APP)
    steady.wait_ready(engine)
    wait_until(lambda: len(fired_instants(engine)) >= 2, timeout=15, what="the first instants")
    rolled_back: list[int] = []
    kills = 0
    for round_ in range(6):
        victim = spawn(f"periodic-victim-{round_}", app=APP, SA_JOBS_TEST_PAUSE_TICK="1")
        victim.wait_ready(engine)
        try:
            # It races the steady process for each instant; when it wins one, it pauses
            # with the instant's job inserted and the row moved, uncommitted.
            wait_until(lambda v=victim: "PAUSED" in v.output(), timeout=8, what="a paused tick")
        except AssertionError:
            victim.kill()
            continue
        paused_line = next(line for line in victim.output().splitlines() if "PAUSED" in line)
        rolled_back += [int(n) for n in paused_line.split()[1:]]
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        kills += 1
        if kills == 3:
            break
    assert kills >= 2, "no victim won an instant; the test proved nothing"
    last = next_fire(engine)
    wait_until(lambda: next_fire(engine) > last + 2 * SECOND, timeout=15, what="later instants")
    assert steady.stop() == 0
    instants = fired_instants(engine)
    assert_one_job_per_instant(instants)
    with Session(engine) as session:
        survivors = session.scalars(select(Job.id).where(Job.id.in_(rolled_back))).all()
    assert survivors == [], "a killed tick's job was committed"
