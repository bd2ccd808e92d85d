"""Failover under load: a primary and a streaming standby of our own
(:mod:`tests.failover.cluster`), producers and ``sa-jobs work --processes 2`` on the
multi-host URL, the primary killed with ``kill -9`` and the standby promoted in the
middle (:mod:`tests.failover.scenario`). The long run is ``scripts/failover.py``.

With synchronous replication nothing acknowledged is lost and everything else holds;
with asynchronous replication the acknowledged-but-lost jobs are PostgreSQL's window
(counted, not asserted away) and nothing else breaks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import sa_jobs
from tests.failover.cluster import Cluster
from tests.failover.failover_app import Work
from tests.failover.pair import build_cluster
from tests.failover.scenario import STREAMS, Findings, WorkerGroup, run_scenario, wait_for

pytestmark = [pytest.mark.slow]

#: No server takes writes for this long: the primary is dead, the standby not promoted.
OUTAGE = 2.0
#: The worker runs again this soon after the promotion (stated in docs/operations.md):
#: its connections fail at once, it reconnects with a backoff capped at 5 s.
RESUME_BOUND = 8.0
#: A job inserted into an idle queue after the switch runs this soon: well under the
#: app's 5 s poll, so a NOTIFY on the new primary woke the worker.
WAKE_UP_BOUND = 1.5
#: SIGTERM to exit, after the switch.
STOP_BOUND = 20.0


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    built = build_cluster(synchronous=request.param == "sync")
    try:
        yield built
    finally:
        built.destroy()


def run(cluster: Cluster, tmp_path: Path) -> Findings:
    findings = run_scenario(cluster, tmp_path, before=4.0, after=5.0, outage=OUTAGE)
    print(findings.summary())
    return findings


def check_everything_but_losses(findings: Findings) -> None:
    log = findings.worker_log[-6000:]
    left = findings.unsettled
    assert findings.drained, f"jobs left unworked after the switch: {left[:10]}\n{log}"
    # Every job on the new primary was worked to completion, at least once.
    ran = findings.executions_per_job()
    not_run = [row for row in findings.rows if row[0] not in ran]
    assert not not_run, f"completed without a run: {not_run[:5]}"
    # At-least-once: a job runs again only in a later attempt (its previous run's
    # outcome was lost and the rescuer gave it back), never the same attempt twice —
    # except, asynchronously, a fetch the new primary never heard of.
    if findings.synchronous:
        for job_id, attempts in findings.duplicates().items():
            assert len(set(attempts)) == len(attempts), (job_id, attempts)
    # The worker came back on its own, and quickly.
    assert findings.resumed_after is not None, log
    assert findings.resumed_after < RESUME_BOUND, findings.summary()
    # LISTEN again, on the new primary: one connection per process, and a wake-up.
    assert findings.listening_backends == 2, findings.listening_backends
    assert findings.wake_up is not None and findings.wake_up < WAKE_UP_BOUND, findings.summary()
    # Leadership moved to the new primary: a live worker holds the lease there.
    assert findings.leader is not None and findings.leader[1], findings.leader
    assert findings.leader[0] in findings.live_workers, (findings.leader, findings.live_workers)
    # Periodic jobs: one per instant, none skipped, across the switch.
    instants = findings.periodic_instants
    assert len(instants) >= 8, instants
    assert len(instants) == len(set(instants)), "an instant fired twice"
    gaps = {b - a for a, b in itertools.pairwise(instants)}
    assert len(gaps) == 1, f"an instant was skipped: {sorted(gaps)}"
    # Job keys: completed jobs released theirs; the last add of each key was worked.
    assert findings.keys_held == 0
    tokens_run = {token for *_rest, token in findings.executions}
    for key, acked in findings.last_per_key.items():
        if acked.token not in findings.lost:
            assert acked.token in tokens_run, (key, acked)
    # Sequences: within a stream, first runs start in id order.
    first_run: dict[int, float] = {}
    for at, job_id, _attempt, _token in findings.executions:
        first_run.setdefault(job_id, at)
    streams: dict[int, list[int]] = {}
    for job_id, token, _state, _attempt in findings.rows:
        added = findings.acked.get(token or "")
        if added is not None and added.stream is not None:
            streams.setdefault(added.stream, []).append(job_id)
    assert len(streams) == STREAMS
    for stream, ids in streams.items():
        starts = [first_run[job_id] for job_id in sorted(ids)]
        assert starts == sorted(starts), f"stream {stream} ran out of id order"
    # The outage is logged when it starts and when it ends, not once per attempt: a
    # process may see two (its LISTEN connection, then the rest), no more.
    lines = findings.worker_log.splitlines()
    began = [line for line in lines if "database operations are failing" in line]
    ended = [line for line in lines if "database operations succeed again after" in line]
    assert 2 <= len(began) <= 4, began
    assert len(ended) == len(began), ended
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == len(began) + len(ended), warnings
    # The worker stopped, bounded, after all this.
    assert findings.stop_code == 0, log
    assert findings.stop_took < STOP_BOUND


@pytest.mark.parametrize("cluster", ["sync"], indirect=True)
def test_synchronous_failover_loses_nothing(cluster: Cluster, tmp_path: Path) -> None:
    findings = run(cluster, tmp_path)
    assert findings.lost == {}, f"{len(findings.lost)} acknowledged jobs lost"
    assert findings.reused_ids == []
    assert len(findings.acked) > 100
    check_everything_but_losses(findings)


@pytest.mark.parametrize("cluster", ["async"], indirect=True)
def test_asynchronous_failover_loses_only_the_replication_window(
    cluster: Cluster, tmp_path: Path
) -> None:
    findings = run(cluster, tmp_path)
    # What was lost was acknowledged just before the kill: within the last second.
    assert all(age < 1.0 for age in findings.lost.values()), findings.lost
    check_everything_but_losses(findings)


#: SIGTERM to exit with no server at all: running jobs finish, their outcomes get
#: SHUTDOWN_FLUSH_TIMEOUT (10 s) of retries, the threads a few seconds to notice.
UNREACHABLE_STOP_BOUND = 25.0


@pytest.mark.parametrize("cluster", ["async"], indirect=True)
def test_a_worker_stops_in_bounded_time_while_no_server_answers(
    cluster: Cluster, tmp_path: Path
) -> None:
    direct = create_engine(cluster.primary.url())
    sa_jobs.migrate(direct)
    group = WorkerGroup(cluster.url(), tmp_path, processes=2, poll=0.5)
    try:
        with Session(direct) as session, session.begin():
            sa_jobs.insert_many(session, [Work(f"long-{n}", seconds=1.5) for n in range(8)])
        # Every slot busy, then the primary gone for good (no promotion).
        assert wait_for(lambda: len(group.executions()) >= 8, timeout=60), group.output()
        direct.dispose()
        cluster.primary.kill9()
        code, took = group.stop(UNREACHABLE_STOP_BOUND + 5)
    finally:
        group.kill()
        direct.dispose()
    log = group.output()
    assert code == 0, log[-4000:]
    assert took < UNREACHABLE_STOP_BOUND, (took, log[-4000:])
    # The outcomes it could not write are said, for the rescuer to retry on a server.
    assert "left to the rescuer" in log or "gave up writing the outcomes" in log, log[-4000:]
