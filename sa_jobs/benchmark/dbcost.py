"""What a drain costs the database, per worked job: statements, round trips, WAL, server CPU.

Two halves, one per side of the wire:

* **client counts**, in each worker process (sa_jobs' or the floor's, the same way):
  :func:`client_counter` wraps psycopg 3's internal entry points once per process, so
  every statement a cursor sends and every command the connection sends on its own
  (``BEGIN``, ``COMMIT``, ``ROLLBACK``, ``SET``) is counted, whatever sent it —
  SQLAlchemy, a raw driver cursor, the floor's bare connection. These count on any server.
* **server figures**, in the parent (:class:`ServerProbe`): WAL written, from
  ``pg_current_wal_lsn()`` before and after (*global*: every database of the server writes
  to the one WAL, so other load on the server adds to it), and, when the server runs on
  this host, the CPU time of the drain's own backends (client backends connected to the
  throwaway database, less the parent's) from ``/proc/<pid>/schedstat`` (nanoseconds),
  which isolates the run from other databases; and the CPU of all the server's
  processes (global: the WAL writer, checkpointer and other databases' backends too).

``pg_stat_statements`` would count statements and WAL per database on the server; it
needs ``shared_preload_libraries`` and a restart, which a benchmark on someone's server
cannot ask for, so the counts are taken on the client for both sides alike.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from sqlalchemy import Connection, Engine, text

from sa_jobs.benchmark.report import Figure

__all__ = [
    "ClientCounts",
    "Drained",
    "ServerCost",
    "ServerProbe",
    "client_counter",
    "cost_figures",
]

#: Clock ticks a second of ``/proc/<pid>/stat``'s utime and stime.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@attrs.frozen
class ClientCounts:
    """What a process sent to the server.

    Attributes:
        statements: SQL statements sent by cursors (each row of an ``executemany`` counts).
        round_trips: Exchanges that wait for the server: each cursor statement outside a
            pipeline, each pipeline's batch, and each command of the connection's own
            (``BEGIN``, ``COMMIT``, ``ROLLBACK``). psycopg's one-off ``PREPARE`` of a
            statement run five times on a connection is not counted.
    """

    statements: int = 0
    round_trips: int = 0

    def __sub__(self, other: ClientCounts) -> ClientCounts:
        return ClientCounts(
            self.statements - other.statements, self.round_trips - other.round_trips
        )

    def __add__(self, other: ClientCounts) -> ClientCounts:
        return ClientCounts(
            self.statements + other.statements, self.round_trips + other.round_trips
        )


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements = 0
        self.round_trips = 0

    def add(self, statements: int, round_trips: int) -> None:
        with self.lock:
            self.statements += statements
            self.round_trips += round_trips

    def snapshot(self) -> ClientCounts:
        with self.lock:
            return ClientCounts(self.statements, self.round_trips)


_counter: _Counter | None = None


def client_counter() -> Callable[[], ClientCounts]:
    """Count this process's psycopg statements and round trips from now on; return a
    function giving the totals so far (take two and subtract).

    Wraps psycopg's private generator methods (the ones ``execute``, ``executemany``,
    ``commit`` and a transaction's implicit ``BEGIN`` go through, sync and async), once per
    process: a benchmark's child process, never an application's.
    """
    global _counter
    if _counter is None:
        _counter = _Counter()
        _wrap_psycopg(_counter)
    return _counter.snapshot


def _wrap_psycopg(counter: _Counter) -> None:
    from psycopg._connection_base import BaseConnection
    from psycopg._cursor_base import BaseCursor

    execute = BaseCursor._execute_gen
    many_pipeline = BaseCursor._executemany_gen_pipeline
    many_plain = BaseCursor._executemany_gen_no_pipeline
    command = BaseConnection._exec_command

    # Each wrapper counts when psycopg builds the generator, which it runs at once.
    def execute_gen(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter.add(1, 0 if self._conn._pipeline else 1)
        return execute(self, *args, **kwargs)

    def executemany_pipeline(self: Any, query: Any, params_seq: Any, *args: Any) -> Any:
        rows = len(params_seq) if hasattr(params_seq, "__len__") else 1
        counter.add(rows, 1)  # one Sync for the batch
        return many_pipeline(self, query, params_seq, *args)

    def executemany_plain(self: Any, query: Any, params_seq: Any, *args: Any) -> Any:
        rows = len(params_seq) if hasattr(params_seq, "__len__") else 1
        counter.add(rows, rows)
        return many_plain(self, query, params_seq, *args)

    def exec_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._pipeline:
            counter.add(0, 1)
        return command(self, *args, **kwargs)

    BaseCursor._execute_gen = execute_gen  # type: ignore[method-assign]
    BaseCursor._executemany_gen_pipeline = executemany_pipeline  # type: ignore[method-assign,assignment]
    BaseCursor._executemany_gen_no_pipeline = executemany_plain  # type: ignore[method-assign,assignment]
    BaseConnection._exec_command = exec_command  # type: ignore[method-assign]


# ---------------------------------------------------------------------- the server side


@attrs.frozen
class ServerCost:
    """What the server did between :meth:`ServerProbe.start` and :meth:`ServerProbe.stop`.

    Attributes:
        wal_bytes: WAL written by the whole server (global).
        backend_cpu: CPU seconds of the drain's own backends, or ``None`` when the server
            is not on this host (or its processes cannot be read).
        server_cpu: CPU seconds of every process of the server (global), or ``None``.
    """

    wal_bytes: int
    backend_cpu: float | None
    server_cpu: float | None


_BACKENDS = text(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> ALL(:excluded)"
)
_LSN = text("SELECT pg_current_wal_lsn()::text")
_WAL_DIFF = text("SELECT pg_wal_lsn_diff(CAST(:after AS pg_lsn), CAST(:before AS pg_lsn))")


class ServerProbe:
    """Samples the server before and after a drain, on a connection of its own.

    ``excluded``: backend pids not to count (the parent's connection that polls for the
    end of the drain); the probe's own connection is left out too.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Connection | None = None
        self._excluded: list[int] = []
        self._lsn = ""
        self._backends: dict[int, int] = {}
        self._server: dict[int, int] | None = None
        self._postmaster: int | None = None

    def start(self, excluded: Iterable[int] = ()) -> None:
        connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._connection = connection
        own = int(connection.scalar(text("SELECT pg_backend_pid()")) or 0)
        self._excluded = [own, *excluded]
        self._postmaster = _parent(own) if _is_postgres(own) else None
        self._backends = self._backend_cpu()
        self._server = self._server_cpu()
        self._lsn = str(connection.scalar(_LSN))

    def stop(self) -> ServerCost:
        connection = self._connection
        if connection is None:
            raise RuntimeError("ServerProbe.stop() without start()")
        try:
            lsn = str(connection.scalar(_LSN))
            backends = self._backend_cpu()
            server = self._server_cpu()
            wal = int(connection.scalar(_WAL_DIFF, {"after": lsn, "before": self._lsn}) or 0)
        finally:
            connection.close()
            self._connection = None
        return ServerCost(
            wal_bytes=wal,
            backend_cpu=_spent(self._backends, backends) if self._postmaster else None,
            server_cpu=_spent(self._server, server),
        )

    def _backend_cpu(self) -> dict[int, int]:
        assert self._connection is not None
        if self._postmaster is None:
            return {}
        pids = self._connection.scalars(_BACKENDS, {"excluded": self._excluded}).all()
        return {pid: spent for pid in pids if (spent := _cpu_ns(pid)) is not None}

    def _server_cpu(self) -> dict[int, int] | None:
        """Every process whose parent is the postmaster, and the postmaster."""
        if self._postmaster is None:
            return None
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (
                int(entry) == self._postmaster or _parent(int(entry)) == self._postmaster
            ):
                spent = _cpu_ns(int(entry))
                if spent is not None:
                    found[int(entry)] = spent
        return found


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()
    return None


def _cpu_ns(pid: int) -> int | None:
    """CPU time ``pid`` has spent, in nanoseconds.

    ``/proc/<pid>/schedstat``'s first field (the scheduler's run time, kept whatever
    ``kernel.sched_schedstats`` says) where the kernel has it: ``stat``'s utime and stime
    count clock ticks (10 ms), and the floor's backends in a small run spend less than one
    tick, which read as no CPU at all. Else those ticks, converted."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])
    fields = _stat(pid)
    # utime and stime are fields 14 and 15 of the file, 12 and 13 after the name.
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _TICKS


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def _is_postgres(pid: int) -> bool:
    """Is ``pid`` a PostgreSQL process on this host (the backend the server named)?

    A remote server's backend pid may happen to exist here as another program."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip() in ("postgres", "postmaster")
    return False


def _spent(before: dict[int, int] | None, after: dict[int, int] | None) -> float | None:
    """CPU seconds between two samples; a process born in between counts from zero."""
    if before is None or after is None:
        return None
    spent = sum(now - before.get(pid, 0) for pid, now in after.items())
    return max(spent, 0) / 1e9


# ---------------------------------------------------------------------- per worked job


@attrs.frozen
class Drained:
    """One drain: its rate, and what it cost the workers and the server.

    Attributes:
        jobs: Jobs drained.
        rate: Jobs per second.
        cpu: Worker CPU seconds (user+sys, every process and thread) over the drain.
        client: What the worker processes sent, summed.
        server: What the server did, or ``None`` when not probed.
    """

    jobs: int
    rate: float
    cpu: float
    client: ClientCounts
    server: ServerCost | None = None

    def per_job(self, value: float) -> float:
        return value / self.jobs


def cost_figures(prefix: str, label: str, ours: Drained, theirs: Drained | None) -> list[Figure]:
    """Statements, round trips, WAL bytes and server CPU per worked job, sa_jobs' against
    the floor's drain (``theirs``); a server figure sa_jobs' drain did not measure is left
    out (the CPU of a server on another host)."""
    rows: list[tuple[str, str, str, Callable[[Drained], float | None]]] = [
        ("statements", "statements per worked job", "stmt", _statements),
        ("round_trips", "round trips per worked job", "trips", _round_trips),
        ("wal_bytes", "WAL bytes per worked job, whole server", "B", _wal_bytes),
        ("backend_cpu", "server CPU per worked job, the drain's backends", "us", _backend_cpu),
        ("server_cpu", "server CPU per worked job, whole server", "us", _server_cpu),
    ]
    figures = []
    for key, what, unit, get in rows:
        mine = get(ours)
        if mine is None:
            continue
        floor = None if theirs is None else get(theirs)
        figures.append(
            Figure(f"{prefix}{key}_per_job", f"{what} ({label})", unit, mine, floor, False)
        )
    return figures


# Each figure per job, in its unit (CPU in microseconds); None when not measured.


def _statements(drained: Drained) -> float:
    return drained.client.statements / drained.jobs


def _round_trips(drained: Drained) -> float:
    return drained.client.round_trips / drained.jobs


def _wal_bytes(drained: Drained) -> float | None:
    server = drained.server
    return None if server is None else server.wal_bytes / drained.jobs


def _backend_cpu(drained: Drained) -> float | None:
    server = drained.server
    if server is None or server.backend_cpu is None:
        return None
    return server.backend_cpu / drained.jobs * 1e6


def _server_cpu(drained: Drained) -> float | None:
    server = drained.server
    if server is None or server.server_cpu is None:
        return None
    return server.server_cpu / drained.jobs * 1e6
