"""``sa-jobs dashboard``: the web dashboard (:mod:`sa_jobs.dashboard`) on its own server.

It listens on 127.0.0.1 unless told otherwise, and refuses to listen anywhere else
without credentials: HTTP basic auth from ``SA_JOBS_DASHBOARD_USER`` and
``SA_JOBS_DASHBOARD_PASSWORD`` (environment only, so the password shows in no process
list). Served by uvicorn, from the ``dashboard`` extra.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
from typing import Any

from sqlalchemy import Engine

from sa_jobs._table.schema import Features, translate_missing_schema
from sa_jobs.cli import settings
from sa_jobs.cli.common import CommandError, UsageError, engine_from, replica_from
from sa_jobs.cli.settings import Setting

__all__ = ["PASSWORD_VARIABLE", "USER_VARIABLE", "add_command", "is_loopback"]

DEFAULT_PORT = 8178
USER_VARIABLE = "SA_JOBS_DASHBOARD_USER"
PASSWORD_VARIABLE = "SA_JOBS_DASHBOARD_PASSWORD"


def _port(text: str) -> int:
    value = settings.positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1 to 65535)")
    return value


def _base_path(text: str) -> str:
    value = text.strip().rstrip("/")
    if value and not value.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r} must start with '/', e.g. /ops/jobs")
    return value


HOST = Setting("host", ("SA_JOBS_DASHBOARD_HOST",), str, "127.0.0.1", option="--host")
PORT = Setting("port", ("SA_JOBS_DASHBOARD_PORT",), _port, DEFAULT_PORT, option="--port")
READ_ONLY = Setting(
    "read_only", ("SA_JOBS_DASHBOARD_READ_ONLY",), settings.flag, False, option="--read-only"
)
BASE_PATH = Setting(
    "base_path", ("SA_JOBS_DASHBOARD_BASE_PATH",), _base_path, "", option="--base-path"
)
SETTINGS = (
    settings.URL,
    settings.LOG_LEVEL,
    HOST,
    PORT,
    READ_ONLY,
    BASE_PATH,
    *settings.REPLICA_SETTINGS,
)


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "dashboard",
        parents=[common, settings.replica_options()],
        help="serve the web dashboard (127.0.0.1 unless told otherwise)",
        description="Serve the sa_jobs web dashboard. It listens on 127.0.0.1 by default; "
        f"to listen elsewhere set {USER_VARIABLE} and {PASSWORD_VARIABLE} (HTTP basic "
        "auth), and put TLS in front of it.",
    )
    parser.add_argument(
        "--host",
        default=argparse.SUPPRESS,
        help="the address to listen on (default: $SA_JOBS_DASHBOARD_HOST, else 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=argparse.SUPPRESS,
        help=f"the port (default: $SA_JOBS_DASHBOARD_PORT, else {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--read-only",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="show the queue but take no actions (default: $SA_JOBS_DASHBOARD_READ_ONLY, else off)",
    )
    parser.add_argument(
        "--base-path",
        type=_base_path,
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the path prefix a reverse proxy serves the dashboard under and strips, "
        "e.g. /ops/jobs (default: $SA_JOBS_DASHBOARD_BASE_PATH)",
    )
    parser.set_defaults(run=_run, settings=SETTINGS)


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(
        ipaddress.ip_address(str(address).split("%")[0]).is_loopback for address in addresses
    )


def _credentials() -> tuple[str, str] | None:
    user = os.environ.get(USER_VARIABLE, "")
    password = os.environ.get(PASSWORD_VARIABLE, "")
    if bool(user) != bool(password):
        raise CommandError(f"set both {USER_VARIABLE} and {PASSWORD_VARIABLE}, or neither")
    return (user, password) if user else None


def _run(options: argparse.Namespace) -> int:
    credentials = _credentials()
    if credentials is None and not is_loopback(options.host):
        raise CommandError(
            f"refusing to serve the dashboard on {options.host} without auth: set "
            f"{USER_VARIABLE} and {PASSWORD_VARIABLE}, or listen on 127.0.0.1"
        )
    try:
        import uvicorn

        from sa_jobs.dashboard import basic_auth, create_app
    except ImportError as exc:
        raise CommandError(
            f"sa-jobs dashboard needs the 'dashboard' extra ({exc.name} is missing): "
            "pip install 'sa-jobs[dashboard]'"
        ) from None
    engine = engine_from(options, pool_size=5)
    replica = replica_from(options, pool_size=5)
    try:
        _check_schema(engine)
        app = create_app(
            engine,
            # On loopback without credentials the CLI lets in whoever reaches this
            # machine's loopback, on purpose: create_app's warning about auth=None is
            # advice for a dashboard mounted in an app, which would repeat every start.
            auth=basic_auth(*credentials) if credentials else _everyone_on_this_machine,
            read_only=options.read_only,
            base_path=options.base_path,
            read_engine=None if replica is None else replica.engine,
            max_replica_lag=options.max_replica_lag.total_seconds(),
            on_replica_lag=options.on_replica_lag,
        )
        # Bound before the URL is printed: a port in use is said in one line, instead
        # of a URL that leads to someone else's server and uvicorn's exit code 3.
        listening = _listen(options.host, options.port)
        where = f"http://{_host_in_url(options.host)}:{options.port}{options.base_path}/"
        print(f"sa_jobs dashboard on {where}" + (" (read-only)" if options.read_only else ""))
        config = uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            log_level=(options.log_level or "WARNING").lower(),
            # Behind a proxy that sets them, links and the CSRF origin check use the
            # client's view of the host.
            proxy_headers=True,
        )
        with listening:
            uvicorn.Server(config).run(sockets=[listening])
    finally:
        engine.dispose()
        if replica is not None:
            replica.sync_engine.dispose()
    return 0


def _everyone_on_this_machine(request: object) -> bool:
    """The CLI's auth on loopback without credentials: only this machine can connect."""
    return True


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one: IPv6 for an address with a
    colon, else IPv4).

    Raises:
        UsageError: the port is taken, or the address cannot be listened on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a restart may rebind at once (a listening socket still conflicts).
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is already in use (another sa-jobs dashboard?); "
                "stop that server, or pick another port with --port"
            ) from None
        raise UsageError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    return listening


def _check_schema(engine: Engine) -> None:
    """Fail now, in one line, on an unreachable database or a missing schema."""
    with translate_missing_schema(), engine.connect() as connection:
        Features.of(connection)


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host
