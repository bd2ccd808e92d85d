"""A real PgBouncer in transaction pooling mode, in front of the test server.

The tests start their own ``pgbouncer`` (Debian's package, 1.18) on a free port, with a
configuration in a temporary directory, and stop it at the end. Two database names lead
to the test database:

* the database's own name, with a pool of :data:`POOL_SIZE` server connections shared by
  every client — what an application behind PgBouncer sees;
* ``<name>_one``, a pool of one server connection, where any session state left on a
  server connection (a prepared statement, a ``LISTEN``) meets the next client for sure.

Without the binary the tests are skipped, saying how to install it — unless
``SA_JOBS_REQUIRE_PGBOUNCER=1`` (set by ``.ci/run``), which makes its absence a failure:
CI must run them.
"""

from __future__ import annotations

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

import attrs
import psycopg
import pytest
from sqlalchemy import URL

#: Server connections per pool: fewer than the clients a worker opens, so they really
#: are shared between clients, transaction by transaction.
POOL_SIZE = 4
REQUIRE_VARIABLE = "SA_JOBS_REQUIRE_PGBOUNCER"
_SEARCH_PATH = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")


@attrs.frozen
class PgBouncer:
    """A running PgBouncer: URLs of the test database through it, and its output."""

    url: URL
    one_connection_url: URL
    admin_url: str
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    for directory in _SEARCH_PATH:
        candidate = Path(directory) / "pgbouncer"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def require_binary() -> str:
    """The pgbouncer binary; skips the test without it (fails under CI, see the module)."""
    found = binary()
    if found is not None:
        return found
    message = "pgbouncer is not installed (apt-get install pgbouncer; bash .ci/run installs it)"
    if os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0"):
        pytest.fail(f"{message}, and ${REQUIRE_VARIABLE} requires it")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_address(url: URL) -> tuple[str, int]:
    # An embedded server listens on a Unix socket named in the URL's query (host=/dir).
    host = url.host or str(url.query.get("host", "127.0.0.1"))
    return host, url.port or 5432


def _config(directory: Path, database_url: URL, port: int) -> Path:
    host, server_port = _server_address(database_url)
    name = database_url.database
    user = database_url.username or "postgres"
    server = f"host={host} port={server_port} dbname={name} user={user}"
    if database_url.password:
        server += f" password={database_url.password}"
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{name} = {server} pool_size={POOL_SIZE}\n"
        f"{name}_one = {server} pool_size=1\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 500\n"
        f"admin_users = {user}\n"
        # A client may wait for a server connection while the pool is busy; never long.
        "query_wait_timeout = 30\n"
    )
    for path in (directory, directory / "userlist.txt", ini):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ini


def _run_as() -> list[str]:
    """PgBouncer refuses to run as root: switch to an unprivileged user then."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["-u", user]
    return []


def _wait_accepting(admin_url: str, process: subprocess.Popen[bytes], log_path: Path) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=2) as admin:
                admin.execute("SHOW VERSION")
            return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise AssertionError(f"pgbouncer did not start:\n{log_path.read_text(errors='replace')}")


@contextlib.contextmanager
def running_pgbouncer(database_url: URL) -> Iterator[PgBouncer]:
    """Start PgBouncer in front of ``database_url``'s server; stop it on exit."""
    executable = require_binary()
    with tempfile.TemporaryDirectory(prefix="sa_jobs_pgbouncer_") as name:
        directory = Path(name)
        log_path = directory / "pgbouncer.log"
        for _attempt in range(3):  # the free port may be taken before pgbouncer binds it
            port = _free_port()
            ini = _config(directory, database_url, port)
            user = database_url.username or "postgres"
            admin_url = f"postgresql://{user}@127.0.0.1:{port}/pgbouncer"
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [executable, *_run_as(), str(ini)], stdout=log, stderr=subprocess.STDOUT
                )
            if _wait_accepting(admin_url, process, log_path):
                break
        else:
            raise AssertionError(f"pgbouncer did not start:\n{log_path.read_text()}")
        through = database_url.set(host="127.0.0.1", port=port, query={})
        try:
            yield PgBouncer(
                url=through,
                one_connection_url=through.set(database=f"{database_url.database}_one"),
                admin_url=admin_url,
                log_path=log_path,
            )
        finally:
            process.send_signal(signal.SIGTERM)  # at once: nothing of ours outlives it
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
