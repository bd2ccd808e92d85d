"""Periodic jobs across real processes: several ticking at once insert exactly one job per
instant; processes killed with SIGKILL between inserting an instant's job and
committing — the maintenance leader among them — leave that instant to be fired once by
another; and a tick paused mid-transaction never silences another process's heartbeat."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import signal

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs._base.states import JobState
from sa_jobs._table.service_tables import Leader, PeriodicState, WorkerProcess
from tests.acceptance.conftest import Spawn
from tests.acceptance.periodic_app import NAME, Nap
from tests.acceptance.processes import WorkerProcessHandle
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


def leader_id(engine: Engine) -> str | None:
    with Session(engine) as session:
        return session.scalar(select(Leader.leader_id).where(Leader.expires_at > func.now()))


def paused_ids(victim: WorkerProcessHandle) -> list[int]:
    line = next(line for line in victim.output().splitlines() if "PAUSED" in line)
    return [int(n) for n in line.split()[1:]]


def test_killing_the_leader_mid_tick_neither_skips_nor_doubles_an_instant(
    engine: Engine, spawn: Spawn
) -> None:
    # Alone, it leads, and it pauses in its first tick that fires: the instant's job
    # inserted and the row moved, uncommitted, the row locked.
    leader = spawn("periodic-leader", app=APP, SA_JOBS_TEST_PAUSE_TICK="1")
    leader.wait_ready(engine)
    wait_until(lambda: "PAUSED" in leader.output(), timeout=10, what="the leader's paused tick")
    wait_until(lambda: leader_id(engine) == "periodic-leader", timeout=10, what="its lead")
    rolled_back = paused_ids(leader)
    other = spawn("periodic-other", app=APP)
    other.wait_ready(engine)
    assert fired_instants(engine) == []  # the paused tick's row is locked: others skip it
    assert leader_id(engine) == "periodic-leader"  # a paused tick does not cost the lead
    leader.signal(signal.SIGKILL)
    assert leader.wait(10) == -signal.SIGKILL
    wait_until(lambda: leader_id(engine) == "periodic-other", timeout=10, what="a new leader")
    wait_until(lambda: len(fired_instants(engine)) >= 4, timeout=15, what="instants after it")
    assert other.stop() == 0
    instants = fired_instants(engine)
    assert_one_job_per_instant(instants)
    assert re.search(r"periodic jobs: \d+ job", other.output()), "the other never ticked"
    with Session(engine) as session:
        survivors = session.scalars(select(Job.id).where(Job.id.in_(rolled_back))).all()
    assert survivors == [], "the killed leader's tick was committed"


def heartbeat_age(engine: Engine, worker_id: str) -> float:
    with engine.connect() as connection:
        age = connection.scalar(
            select(func.now() - WorkerProcess.heartbeat_at).where(WorkerProcess.id == worker_id)
        )
    assert age is not None
    return float(age.total_seconds())


def test_a_tick_paused_mid_transaction_silences_no_heartbeat(engine: Engine, spawn: Spawn) -> None:
    # A process without periodic jobs leads and rescues (rescue_after is 1 s here).
    spawn("periodic-rescuer", app=APP, SA_JOBS_TEST_NO_PERIODIC="1").wait_ready(engine)
    quick = {"SA_JOBS_TEST_REGISTER_INTERVAL": "0.2"}  # re-registers all the time
    steady = spawn("periodic-steady", app=APP, SA_JOBS_TEST_LONG_QUEUE="1", **quick)
    steady.wait_ready(engine)
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, Nap(seconds=120)).job.id

    def job() -> Job:
        with Session(engine) as session:
            found = session.get(Job, job_id)
            assert found is not None
            return found

    wait_until(lambda: job().state == JobState.RUNNING, timeout=10, what="the long job to run")
    for round_ in range(4):
        victim = spawn(f"periodic-victim-{round_}", app=APP, SA_JOBS_TEST_PAUSE_TICK="1", **quick)
        try:
            wait_until(lambda v=victim: "PAUSED" in v.output(), timeout=8, what="a paused tick")
            break
        except AssertionError:
            victim.kill()
    else:
        pytest.fail("no victim won an instant; the test proved nothing")
    # The victim holds the row locked for minutes. Watch for three times rescue_after:
    # the steady process keeps beating and keeps its job.
    deadline = dt.datetime.now(dt.UTC) + 3 * SECOND
    while dt.datetime.now(dt.UTC) < deadline:
        assert heartbeat_age(engine, "periodic-steady") < 1.0, "silent for rescue_after"
        running = job()
        assert (running.state, running.attempt) == (JobState.RUNNING, 1), "the job was rescued"
        assert "PAUSED" in victim.output() and victim.popen.poll() is None
    assert running.attempted_by == ["periodic-steady"]
