"""A primary and a streaming standby of their own, built on this machine for the failover
tests and ``scripts/failover.py``.

Debian's PostgreSQL 15 binaries (:data:`BIN`) make them: ``initdb`` a primary in a
temporary directory, ``pg_basebackup -R`` a standby from it, each on a free port of
127.0.0.1. PostgreSQL refuses to run as root, so when we are root every command runs as
the ``postgres`` OS user (``runuser``) and the directories are handed to it.

``synchronous=True`` names the standby in ``synchronous_standby_names`` with
``synchronous_commit = remote_apply``: a commit returns once the standby has applied it,
so nothing a client saw committed can be lost by promoting the standby. With
``synchronous=False`` a commit returns once the primary's WAL is flushed, and whatever
the standby had not received when the primary died is gone after the promotion.

:meth:`Cluster.fail_over` is the failure: ``kill -9`` the primary's postmaster (its
backends are killed too, as the machine going away would), then ``pg_ctl promote`` the
standby. :meth:`Cluster.destroy` kills whatever still runs and deletes the directories;
it runs on exit whatever happened (the fixtures' finalizers, and :mod:`atexit`).

Nothing here touches another server: the clusters listen on 127.0.0.1 only, on ports
found free, and their data lives under a directory of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import URL, Connection, create_engine, text
from sqlalchemy.pool import NullPool

__all__ = ["BIN", "Cluster", "available", "free_port"]

BIN = Path(os.environ.get("SA_JOBS_PG_BIN", "/usr/lib/postgresql/15/bin"))
OS_USER = "postgres"
#: The standby's name in ``synchronous_standby_names`` and its ``application_name``.
STANDBY_NAME = "standby1"
DATABASE = "failover"


def available() -> str | None:
    """Why the clusters cannot be built here, or None."""
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {BIN} (set SA_JOBS_PG_BIN)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            return f"running as root and there is no {OS_USER!r} OS user to run PostgreSQL"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", OS_USER, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], timeout: float = 120) -> str:
    done = subprocess.run(
        _as_owner(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout


class Node:
    """One PostgreSQL server: its data directory, port and log."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.data = root / name
        self.port = free_port()
        self.log = root / f"{name}.log"

    def start(self) -> None:
        _run(
            [
                str(BIN / "pg_ctl"),
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data}",
            ]
        )

    def pid(self) -> int | None:
        """The postmaster's pid, from its pid file (None when not running)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def backend_pids(self) -> list[int]:
        """Processes whose parent is this postmaster."""
        pid = self.pid()
        if pid is None:
            return []
        children = Path(f"/proc/{pid}/task/{pid}/children")
        with contextlib.suppress(OSError):
            return [int(p) for p in children.read_text().split()]
        return []

    def kill9(self) -> None:
        """SIGKILL the postmaster and its children: the server is gone at once."""
        pid = self.pid()
        if pid is None:
            return
        victims = [pid, *self.backend_pids()]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(v) for v in victims):
            time.sleep(0.02)

    def stop(self) -> None:
        if self.pid() is not None and _alive(self.pid() or 0):
            with contextlib.suppress(Exception):
                _run([str(BIN / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)], 30)
        self.kill9()

    def url(self, database: str = DATABASE) -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=database,
        )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


class Cluster:
    """A primary and its standby (see the module); :meth:`destroy` when done."""

    def __init__(self, *, synchronous: bool, parent: Path | None = None) -> None:
        problem = available()
        if problem:
            raise RuntimeError(problem)
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="sa_jobs_failover_", dir=parent))
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, OS_USER, OS_USER)
        self.primary = Node("primary", self.root)
        self.standby = Node("standby", self.root)
        self.promoted_at: float | None = None
        self.killed_at: float | None = None
        self.dead_at: float | None = None
        self._destroyed = False
        atexit.register(self.destroy)
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    def _build(self) -> None:
        _run(
            [
                str(BIN / "initdb"),
                "-D",
                str(self.primary.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ]
        )
        settings = [
            "wal_level = replica",
            "max_wal_senders = 5",
            "max_connections = 100",
            "fsync = off",  # a test cluster: the kill is of processes, not of the machine
            "wal_sender_timeout = 5s",
            "wal_receiver_status_interval = 1s",
            "hot_standby = on",
            "log_line_prefix = '%m [%p] '",
        ]
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.write("\n".join(settings) + "\n")
        with open(self.primary.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication postgres 127.0.0.1/32 trust\n")
        self.primary.start()
        with self.admin(self.primary) as connection:
            connection.execute(text(f"CREATE DATABASE {DATABASE}"))
        _run(
            [
                str(BIN / "pg_basebackup"),
                "-D",
                str(self.standby.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.primary.port),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "-c",
                "fast",
            ]
        )
        # -R wrote primary_conninfo; the standby names itself for synchronous_standby_names.
        with open(self.standby.data / "postgresql.auto.conf", "a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} user=postgres "
                f"application_name={STANDBY_NAME}'\n"
            )
        self.standby.start()
        if self.synchronous:
            # Only now: with the standby named before it streams, every commit waits.
            with self.admin(self.primary) as connection:
                connection.execute(
                    text(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                )
                connection.execute(text("ALTER SYSTEM SET synchronous_commit = remote_apply"))
                connection.execute(text("SELECT pg_reload_conf()"))
        self.wait_streaming()

    @contextlib.contextmanager
    def admin(self, node: Node, database: str = "postgres") -> Iterator[Connection]:
        engine = create_engine(node.url(database), isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with engine.connect() as connection:
                yield connection
        finally:
            engine.dispose()

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees its standby streaming (and, synchronous, as ``sync``)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while True:
            with self.admin(self.primary) as connection:
                states = connection.execute(
                    text("SELECT state, sync_state FROM pg_stat_replication")
                ).all()
            if ("streaming", want) in [tuple(s) for s in states]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({want}): {states}")
            time.sleep(0.1)

    def url(self, database: str = DATABASE) -> URL:
        """The multi-host URL the clients use: both servers, the writable one chosen."""
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            database=database,
            query={
                # SQLAlchemy's form: one host=host:port per server, passed on to libpq
                # as host=a,b port=p,q (a single "host=a:p,b:q" is not split).
                "host": (f"127.0.0.1:{self.primary.port}", f"127.0.0.1:{self.standby.port}"),
                "target_session_attrs": "read-write",
                "connect_timeout": "3",
            },
        )

    def new_primary_url(self, database: str = DATABASE) -> URL:
        """The promoted standby, directly (for the checks afterwards)."""
        return self.standby.url(database)

    def fail_over(self, outage: float = 0.0) -> None:
        """``kill -9`` the primary, then promote the standby (see the module) after
        ``outage`` seconds — a failover manager takes that long to decide (Patroni's
        ``ttl`` is 30 s by default), and meanwhile no server takes writes."""
        self.killed_at = time.monotonic()
        self.primary.kill9()
        #: When every process of the primary was gone (wall clock: a commit
        #: acknowledged up to then may be lost).
        self.dead_at = time.time()
        time.sleep(outage)
        _run([str(BIN / "pg_ctl"), "promote", "-w", "-t", "60", "-D", str(self.standby.data)])
        self.promoted_at = time.monotonic()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        for node in (self.standby, self.primary):
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)
