"""One failover under load, and what it left behind — shared by the tests
(``tests/failover/test_failover.py``) and the long run (``scripts/failover.py``).

:class:`Producers` commit jobs through the cluster's multi-host URL and record the ids
of those whose commit returned (acknowledged) apart from those whose commit raised
(uncertain: they may exist or not). :class:`WorkerGroup` is ``sa-jobs work --processes
N`` on the same URL. :func:`run_scenario` runs them, fails the primary over in the middle
and waits for the queue to drain; :class:`Findings` is what the checks read.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.failover.cluster import Cluster
from tests.failover.failover_app import BEAT, Sequenced, Work

ROOT = Path(__file__).parents[2]
APP = "tests.failover.failover_app:make_worker"
#: Streams of sequenced jobs, and job keys, the producers cycle through.
STREAMS = 4
KEYS = 3


@attrs.define
class Acked:
    token: str
    job_id: int
    at: float  # time.time() when the commit returned
    kind: str
    key: str | None = None
    #: A sequenced job's stream.
    stream: int | None = None


class Producers:
    """``threads`` threads committing one job per transaction until stopped: a plain job
    each time, a sequenced one every third, a keyed one (``job_key``) every fifth."""

    def __init__(self, url: Any, threads: int = 2, pause: float = 0.01) -> None:
        self.engine = create_engine(url, pool_size=threads, max_overflow=0)
        self.acked: dict[str, Acked] = {}
        self.uncertain: dict[str, float] = {}
        self.uncertain_keys: set[str] = set()
        self.failures = 0
        self.halt = threading.Event()
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._pause = pause
        self._threads = [
            threading.Thread(target=self._run, name=f"producer-{n}", daemon=True)
            for n in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.halt.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(30)
        self.engine.dispose()

    def _run(self) -> None:
        while not self.halt.is_set():
            n = next(self._counter)
            token = uuid.uuid4().hex
            key = f"key-{n % KEYS}" if n % 5 == 0 else None
            args: Any = Sequenced(stream=n % STREAMS, token=token) if n % 3 == 0 else Work(token)
            try:
                with Session(self.engine) as session, session.begin():
                    result = sa_jobs.insert(session, args, job_key=key)
                    job_id = result.job.id
            except Exception:
                with self._lock:
                    self.failures += 1
                    self.uncertain[token] = time.time()
                    if key:
                        self.uncertain_keys.add(key)
                self.halt.wait(0.05)
                continue
            with self._lock:
                stream = args.stream if isinstance(args, Sequenced) else None
                self.acked[token] = Acked(
                    token, job_id, time.time(), type(args).__name__, key, stream
                )
            self.halt.wait(self._pause)

    def last_per_key(self) -> dict[str, Acked]:
        """The last acknowledged keyed insert of each key no uncertain insert followed."""
        last: dict[str, Acked] = {}
        for acked in sorted(self.acked.values(), key=lambda a: a.at):
            if acked.key:
                last[acked.key] = acked
        return {k: v for k, v in last.items() if k not in self.uncertain_keys}


class WorkerGroup:
    """``sa-jobs work --processes N`` on the cluster's URL; its log in a file."""

    def __init__(self, url: Any, workdir: Path, processes: int = 2, poll: float = 5.0) -> None:
        self.runs_dir = workdir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "worker.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SA_JOBS_")}
        env.update(
            SA_JOBS_FAILOVER_URL=url.render_as_string(hide_password=False),
            SA_JOBS_FAILOVER_RUNS=str(self.runs_dir),
            SA_JOBS_FAILOVER_POLL=str(poll),
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(ROOT),
        )
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "sa_jobs.cli", "work", APP, "--processes", str(processes)],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM; the exit code (None: still running, then killed) and the time taken."""
        started = time.monotonic()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - started
        self.kill()
        return code, took

    def kill(self) -> None:
        """Make sure the parent and its children are gone."""
        if self.popen.poll() is None:
            # The children run in process groups of their own; the parent's death makes
            # them stop within a second, and SIGKILL to them by pid settles it.
            children = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            self.popen.kill()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            self.popen.wait(10)
        self._log.close()

    def executions(self) -> list[tuple[float, int, int, str]]:
        """Every handler run, ``(time, job id, attempt, token)``, in time order."""
        rows = []
        for path in self.runs_dir.glob("*.runs"):
            for line in path.read_text().splitlines():
                at, job_id, attempt, token = line.split()
                rows.append((float(at), int(job_id), int(attempt), token))
        return sorted(rows)


@attrs.define
class Findings:
    """What a failover left behind (see :func:`run_scenario`)."""

    synchronous: bool
    acked: dict[str, Acked]
    uncertain: dict[str, float]
    killed_at: float
    promoted_at: float
    #: Acknowledged jobs not on the new primary (token -> seconds between their
    #: acknowledgement and the moment the primary's last process was gone).
    lost: dict[str, float]
    #: Acknowledged ids that now belong to another job (the id was handed out again).
    reused_ids: list[int]
    #: Jobs on the new primary, ``(id, token, state, attempt)``.
    rows: list[tuple[int, str | None, JobState, int]]
    executions: list[tuple[float, int, int, str]]
    #: Seconds from the promotion to the first handler run that started after it.
    resumed_after: float | None
    #: Seconds from inserting one job after the drain to its run (NOTIFY, not polling).
    wake_up: float | None
    listening_backends: int
    leader: tuple[str, bool] | None
    live_workers: set[str]
    periodic_instants: list[dt.datetime]
    keys_held: int
    last_per_key: dict[str, Acked]
    drained: bool
    #: Jobs neither completed nor discarded by a taken key, when the drain ended.
    unsettled: list[tuple[Any, ...]]
    #: Jobs discarded because a later add took their key while they ran.
    key_taken: int
    stop_code: int | None
    stop_took: float
    worker_log: str

    def executions_per_job(self) -> dict[int, list[int]]:
        runs: dict[int, list[int]] = collections.defaultdict(list)
        for _at, job_id, attempt, _token in self.executions:
            runs[job_id].append(attempt)
        return runs

    def duplicates(self) -> dict[int, list[int]]:
        """Jobs run more than once, with the attempts of their runs."""
        return {j: a for j, a in self.executions_per_job().items() if len(a) > 1}

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "synchronous" if self.synchronous else "asynchronous",
            "acknowledged": len(self.acked),
            "uncertain": len(self.uncertain),
            "lost": len(self.lost),
            "lost_window_s": round(max(self.lost.values()), 3) if self.lost else 0.0,
            "reused_ids": len(self.reused_ids),
            "jobs_run_twice": len(self.duplicates()),
            "resumed_after_promotion_s": _round(self.resumed_after),
            "notify_wake_up_s": _round(self.wake_up),
            "promotion_s": round(self.promoted_at - self.killed_at, 3),
            "drained": self.drained,
            "key_taken_discarded": self.key_taken,
            **({"unsettled": [str(row) for row in self.unsettled[:5]]} if self.unsettled else {}),
            "stop_s": round(self.stop_took, 2),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


#: Jobs that are done: completed, or discarded because a later add took their key while
#: they ran (docs/job-keys.md: such a job never runs again, and a run whose outcome
#: was lost in the failover is not retried).
_UNSETTLED = text(
    "SELECT id, kind, state, attempt, max_attempts, scheduled_at, metadata"
    " FROM sa_job WHERE kind != :beat AND state != 'completed'"
    " AND NOT (state = 'discarded' AND metadata ? 'job_key_replaced_at')"
    " ORDER BY id"
)


def _unsettled(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(_UNSETTLED, {"beat": BEAT}).all())


def _settled(engine: Engine) -> bool:
    return not _unsettled(engine)


def run_scenario(
    cluster: Cluster,
    workdir: Path,
    *,
    before: float,
    after: float,
    outage: float = 0.0,
    processes: int = 2,
    producer_threads: int = 2,
    drain_timeout: float = 60.0,
    stop_timeout: float = 30.0,
    poll: float = 5.0,
) -> Findings:
    """Migrate, start the workers and the producers, let them run ``before`` seconds,
    fail over (``outage`` seconds between the kill and the promotion), produce ``after``
    more seconds, stop producing, wait for the queue to drain, measure a NOTIFY wake-up,
    stop the workers (SIGTERM), and read what is left.
    """
    direct = create_engine(cluster.primary.url())
    sa_jobs.migrate(direct)
    direct.dispose()
    url = cluster.url()
    group = WorkerGroup(url, workdir, processes=processes, poll=poll)
    producers = Producers(url, threads=producer_threads)
    check = create_engine(url, pool_pre_ping=True)
    try:
        ready = wait_for(lambda: _live_workers(check) >= processes, timeout=60)
        if not ready:
            raise RuntimeError(f"the workers did not start:\n{group.output()[-4000:]}")
        producers.start()
        time.sleep(before)
        killed_wall = time.time()
        cluster.fail_over(outage)
        promoted_wall = time.time()
        time.sleep(after)
        producers.stop()
        check.dispose()  # its connections were to the old primary
        check = create_engine(cluster.new_primary_url())
        drained = wait_for(lambda: _settled(check), timeout=drain_timeout, interval=0.2)
        unsettled = [tuple(row) for row in _unsettled(check)]
        wake_up = _measure_wake_up(check, group) if drained else None
        with check.connect() as connection:
            listening = connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query ILIKE 'LISTEN %' AND state = 'idle'"
                )
            )
            leader_row = connection.execute(
                text("SELECT leader_id, expires_at > now() FROM sa_job_leader")
            ).first()
            workers = set(
                connection.scalars(
                    text(
                        "SELECT id FROM sa_job_worker"
                        " WHERE heartbeat_at > now() - interval '2 seconds'"
                    )
                )
            )
            keys_held = connection.scalar(
                text("SELECT count(*) FROM sa_job WHERE job_key IS NOT NULL")
            )
        stop_code, stop_took = group.stop(stop_timeout)
        with Session(check) as session:
            jobs = session.scalars(select(Job)).all()
            rows = [
                (
                    j.id,
                    j.args_json.get("token") if isinstance(j.args_json, dict) else None,
                    j.state,
                    j.attempt,
                )
                for j in jobs
                if j.kind != BEAT
            ]
            instants = sorted(
                dt.datetime.fromisoformat(j.metadata_["periodic"]["instant"])
                for j in jobs
                if j.kind == BEAT
            )
    finally:
        # The worker processes first: nothing below may leave them running.
        group.kill()
        producers.stop()
        check.dispose()
    executions = group.executions()
    by_token = {row[1]: row for row in rows}
    by_id = {row[0]: row for row in rows}
    # A keyed add that found its key's job still waiting replaced that job's args in
    # place (job_key_mode="replace"): the earlier token is gone, not lost.
    same_job: dict[tuple[str, int], list[Acked]] = collections.defaultdict(list)
    for acked in producers.acked.values():
        if acked.key:
            same_job[acked.key, acked.job_id].append(acked)
    replaced = {
        earlier.token
        for adds in same_job.values()
        for earlier in sorted(adds, key=lambda a: a.at)[:-1]
    }
    missing = {
        token: acked
        for token, acked in producers.acked.items()
        if token not in by_token and token not in replaced
    }
    dead_at = cluster.dead_at or killed_wall
    lost = {token: dead_at - acked.at for token, acked in missing.items()}
    reused = [acked.job_id for acked in missing.values() if acked.job_id in by_id]
    resumed = [at for at, *_ in executions if at > promoted_wall]
    return Findings(
        synchronous=cluster.synchronous,
        acked=producers.acked,
        uncertain=producers.uncertain,
        killed_at=killed_wall,
        promoted_at=promoted_wall,
        lost=lost,
        reused_ids=reused,
        rows=rows,
        executions=executions,
        resumed_after=(resumed[0] - promoted_wall) if resumed else None,
        wake_up=wake_up,
        listening_backends=int(listening or 0),
        leader=(leader_row[0], bool(leader_row[1])) if leader_row else None,
        live_workers=workers,
        periodic_instants=instants,
        keys_held=int(keys_held or 0),
        last_per_key=producers.last_per_key(),
        drained=drained,
        unsettled=unsettled,
        key_taken=sum(1 for row in rows if row[2] is JobState.DISCARDED),
        stop_code=stop_code,
        stop_took=stop_took,
        worker_log=group.output(),
    )


def _live_workers(engine: Engine) -> int:
    try:
        with engine.connect() as connection:
            return int(
                connection.scalar(
                    text(
                        "SELECT count(*) FROM sa_job_worker"
                        " WHERE heartbeat_at > now() - interval '2 seconds'"
                    )
                )
                or 0
            )
    except Exception:
        return 0


def _measure_wake_up(engine: Engine, group: WorkerGroup) -> float | None:
    """Insert one job into the idle queue; how long until a handler ran it."""
    token = f"wake-{uuid.uuid4().hex}"
    time.sleep(0.5)  # idle: every producer is waiting, not in the middle of a fetch
    started = time.time()  # the NOTIFY goes out at the commit, and may be heard at once
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Work(token, seconds=0.0))
    ran: list[float] = []

    def picked() -> bool:
        ran[:] = [at for at, *_rest, t in group.executions() if t == token]
        return bool(ran)

    if not wait_for(picked, timeout=15, interval=0.02):
        return None
    return ran[0] - started
