"""``sa-jobs work MODULE:ATTRIBUTE``: run an application's worker until a signal, until
it is idle, or as several processes under one parent (:mod:`sa_jobs.cli.processes`).

**Which database.** The worker works the database of its own engine — the application
builds it, with its pool, ``creator`` and ``connect_args``, and its handlers' sessions
use it. ``--url`` (or ``$SA_JOBS_DATABASE_URL``, ``$DATABASE_URL``) is exported to the
application as ``$SA_JOBS_DATABASE_URL`` so that an app building its engine from that
variable follows it; an app whose engine reaches another database is refused before
anything runs (:func:`check_worker_database`), naming both: two settings that disagree
about where the jobs are must not be settled by silently working one of them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import URL, create_engine
from sqlalchemy.pool import NullPool

from sa_jobs._base.urls import servers
from sa_jobs._declare.queue_config import Queue
from sa_jobs.cli import processes, settings
from sa_jobs.cli.common import CommandError, UsageError, first_line, parse_url
from sa_jobs.cli.settings import QueueSpec
from sa_jobs.errors import a_or_an
from sa_jobs.worker import Worker
from sa_jobs.worker.engines import database_identity

__all__ = ["add_command", "check_worker_database", "load_worker", "queues_from"]

log = logging.getLogger("sa_jobs.cli")

SETTINGS = (
    settings.URL,
    settings.LOG_LEVEL,
    settings.WORKER,
    settings.QUEUES,
    settings.CONCURRENCY,
    settings.PROCESSES,
    settings.UNTIL_IDLE,
    settings.REPLACE_STUCK,
)


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "work",
        parents=[common],
        help="run a worker until SIGTERM/SIGINT (or until idle)",
        description="Import MODULE (the current directory is on the path), take ATTRIBUTE — "
        "a sa_jobs.Worker, or a function of no arguments returning one — and run it until "
        "SIGTERM or SIGINT. A first signal lets running jobs finish; a second cancels them.",
    )
    parser.add_argument(
        "app",
        nargs="?",
        default=argparse.SUPPRESS,
        metavar="MODULE:ATTRIBUTE",
        help="e.g. myapp.jobs:worker (default: $SA_JOBS_WORKER)",
    )
    parser.add_argument(
        "-q",
        "--queue",
        dest="queues",
        action="append",
        type=settings.queue_spec,
        default=argparse.SUPPRESS,
        metavar="NAME[=N][:fair_by=F]",
        help="work this queue, N of its jobs at once (repeatable; replaces the worker's own "
        "queues, keeping the fairness and weights its code gives a queue of that name; "
        "default: $SA_JOBS_QUEUES, e.g. mail=10,default=5). :fair_by=FIELD[+FIELD] or "
        ":fair_by_metadata=KEY makes it a fair queue (e.g. reports=10:fair_by=tenant_id)",
    )
    parser.add_argument(
        "--concurrency",
        type=settings.positive_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="jobs at once for each queue named without =N; without -q, for each of the "
        f"worker's queues (default: $SA_JOBS_CONCURRENCY, else {settings.DEFAULT_CONCURRENCY} "
        "for -q NAME and the worker's own figures otherwise)",
    )
    parser.add_argument(
        "--processes",
        type=settings.positive_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="run N worker processes under this one, which passes them SIGTERM/SIGINT "
        "(default: $SA_JOBS_PROCESSES, else 1)",
    )
    parser.add_argument(
        "--until-idle",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="work every job that is due now, then exit 0 (default: $SA_JOBS_UNTIL_IDLE)",
    )
    parser.add_argument(
        "--replace-stuck",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="when a process's handler threads stuck past their timeout reach its "
        "stuck_thread_limit, stop it gracefully and exit "
        f"{processes.STUCK_EXIT_CODE}; under --processes the parent starts a fresh one "
        "(default: $SA_JOBS_REPLACE_STUCK, else off)",
    )
    # Given by a --processes parent to its children: they stop when it is gone.
    parser.add_argument(
        "--supervised-by", type=int, default=None, metavar="PID", help=argparse.SUPPRESS
    )
    parser.set_defaults(run=_work, settings=SETTINGS, default_log_level="INFO")


def _work(options: argparse.Namespace) -> int:
    if not options.app:
        raise UsageError("name the worker: sa-jobs work MODULE:ATTRIBUTE, or set SA_JOBS_WORKER")
    specs: Sequence[QueueSpec] = options.queues or ()
    queues_from(specs, options.concurrency)  # a queue named twice is refused before the import
    source = _url_source(options.url)
    if options.url:
        # A URL of another database is said in one line, before the app builds an
        # engine on it (its driver may not even be installed).
        parse_url(options.url)
        # The worker's engine is the application's own; an app that builds it from this
        # variable follows --url, and so do --processes children (they inherit it).
        os.environ["SA_JOBS_DATABASE_URL"] = options.url
    worker = load_worker(options.app)
    if options.url:
        check_worker_database(worker, options.url, source=source, app=options.app)
    log.info(
        "%s works %s (its own engine%s)",
        options.app,
        _describe(worker.engine.url),
        f"; {source} names the same" if options.url else "",
    )
    if specs:
        worker.queues = queues_from(specs, options.concurrency, worker.fair)
    elif options.concurrency:
        worker.queues = _with_concurrency(worker, options.concurrency)
    if options.processes > 1:
        return processes.supervise(
            _child_command(options, worker),
            options.processes,
            options.until_idle,
            replace_stuck=options.replace_stuck,
        )
    if options.supervised_by:
        processes.watch_parent(options.supervised_by)
    stuck = processes.watch_stuck(worker) if options.replace_stuck else None
    code = _until_idle(worker) if options.until_idle else _run(worker)
    return processes.STUCK_EXIT_CODE if stuck is not None and stuck.is_set() else code


def queues_from(
    specs: Sequence[QueueSpec], concurrency: int | None, own: Mapping[str, Queue] | None = None
) -> dict[str, int | Queue]:
    """``-q`` values as the Worker's ``queues``; a queue named twice is a mistake.

    ``own``: the fair queues the worker's code declares. A ``-q`` naming one of them
    without fairness options keeps its fairness and weights (only the concurrency is the
    command line's): dropping them would let one tenant's backlog block the others again,
    and nothing would say so. One with ``:fair_by=...`` keeps the code's weights only if
    it names the same key (weights are per key text).

    Raises:
        UsageError: a queue is named twice.
    """
    queues: dict[str, int | Queue] = {}
    for spec in specs:
        if spec.name in queues:
            raise UsageError(
                f"queue {spec.name!r} is named twice in -q/$SA_JOBS_QUEUES; name it once"
            )
        figure = spec.concurrency or concurrency or settings.DEFAULT_CONCURRENCY
        declared = (own or {}).get(spec.name)
        if spec.fair:
            fair = Queue(figure, fair_by=spec.fair_by, fair_by_metadata=spec.fair_by_metadata)
            if declared is not None and declared.key_spec == fair.key_spec:
                fair = attrs.evolve(fair, weights=declared.weights)
            queues[spec.name] = fair
        elif declared is not None:
            queues[spec.name] = attrs.evolve(declared, concurrency=figure)
        else:
            queues[spec.name] = figure
    return queues


def _with_concurrency(worker: Worker, concurrency: int) -> dict[str, int | Queue]:
    """The worker's own queues, each at ``concurrency``, the fair ones still fair."""
    fair = worker.fair
    return {
        name: attrs.evolve(fair[name], concurrency=concurrency) if name in fair else concurrency
        for name in worker.queues
    }


def _child_command(options: argparse.Namespace, worker: Worker) -> list[str]:
    """One child's command line: everything resolved, so the environment cannot differ
    (and ``SA_JOBS_PROCESSES`` cannot make the child a parent in turn). A fair queue is
    named with its key, so a fairness given by ``-q`` reaches the children too."""
    command = [sys.executable, "-m", "sa_jobs.cli", "work", options.app, "--processes", "1"]
    command += ["--log-level", options.log_level or options.default_log_level]
    command += ["--until-idle" if options.until_idle else "--no-until-idle"]
    command += ["--supervised-by", str(os.getpid())]
    command += ["--replace-stuck" if options.replace_stuck else "--no-replace-stuck"]
    fair = worker.fair
    for name, concurrency in worker.queues.items():
        queue = fair.get(name)
        spec = QueueSpec(
            name,
            concurrency,
            fair_by=queue.fair_by if queue is not None else None,
            fair_by_metadata=queue.fair_by_metadata if queue is not None else None,
        )
        command += ["-q", spec.text()]
    return command


def _run(worker: Worker) -> int:
    worker.run()
    return 0


def _until_idle(worker: Worker) -> int:
    # run_until_idle handles SIGTERM/SIGINT itself: the first lets running jobs finish
    # and returns, a second cancels them; either way the rest stays queued.
    result = worker.run_until_idle(timeout=None)
    # Exit 0 even with jobs left in queues this worker does not serve (it warned about
    # them): serving some queues only is a normal deployment, not a failed run.
    left = "".join(
        f", {count} available in {queue!r} (not served here)"
        for queue, count in result.unserved.items()
    )
    ending = "stopped early" if result.stopped_early else "idle"
    log.info("%s: %d attempts worked%s", ending, result.worked, left)
    return 0


def _url_source(url: str | None) -> str:
    """Where the resolved URL came from, for messages: the variable holding it, else
    the command line."""
    for variable in settings.URL.variables:
        if url and os.environ.get(variable) == url:
            return f"${variable}"
    return "--url"


def _address(url: URL) -> tuple[str, int, str | None]:
    return (str(url.host or url.query.get("host") or "localhost"), url.port or 5432, url.database)


def _describe(url: URL, identity: tuple[object, ...] | None = None) -> str:
    name = identity[1] if identity is not None else url.database
    return f"database {name!r} at {servers(url)}"


def check_worker_database(worker: Worker, raw_url: str, *, source: str, app: str) -> None:
    """Refuse a worker whose own engine reaches another database than ``raw_url``.

    The same host, port and database name are the same database; other spellings (a
    host name and its address, a pooler in front) are compared by connecting both and
    reading :func:`~sa_jobs.worker.engines.database_identity` (server start, database
    and its oid, the ``sa_job`` table reached), as the worker does for its own engines.

    Raises:
        UsageError: they differ.
        CommandError: the URL cannot be parsed, or is not PostgreSQL's.
    """
    named = parse_url(raw_url)
    engine = worker.engine
    if _address(named) == _address(engine.url):
        return
    with engine.connect() as connection:
        actual = database_identity(connection)
    wanted: tuple[object, ...] | None = None
    problem = ""
    probe = create_engine(named, poolclass=NullPool)
    try:
        with probe.connect() as connection:
            wanted = database_identity(connection)
    except Exception as exc:  # any failure to connect means "not that database"
        problem = f" (which cannot be reached: {first_line(exc)})"
    finally:
        probe.dispose()
    # The role may differ; the server, the database and the sa_job table may not.
    if wanted is not None and (wanted[:2], wanted[3:]) == (actual[:2], actual[3:]):
        return
    raise UsageError(
        f"{source} names {_describe(named, wanted)}{problem}, but the worker {app} builds its "
        f"own engine on {_describe(engine.url, actual)}; a worker works its own engine's "
        "database, so make them agree — build the engine from $SA_JOBS_DATABASE_URL "
        f"(sa-jobs work sets it from {source}) — or leave {source} out"
    )


def load_worker(spec: str) -> Worker:
    """Import ``MODULE:ATTRIBUTE`` and return the :class:`sa_jobs.Worker` it names.

    ``ATTRIBUTE`` may be dotted (``module:app.worker``) and may name a function of no
    arguments that returns the worker. The current directory goes first on
    ``sys.path``, as ``uvicorn`` and ``celery`` do, so ``sa-jobs work app:worker`` finds
    ``./app.py``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{spec!r} is not MODULE:ATTRIBUTE, e.g. myapp.jobs:worker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing *named* module is the user's typo; a missing import inside it
        # is a bug in their code and keeps its traceback.
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise
        raise CommandError(f"cannot import module {module_name!r}: {exc}") from None
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Worker) and callable(target):
        target = target()
    if not isinstance(target, Worker):
        raise CommandError(
            f"{spec} is {a_or_an(type(target).__name__)}, not a sa_jobs.Worker "
            "(or a function of no arguments returning one)"
        )
    return target


def _is_prefix(name: str, module_name: str) -> bool:
    return module_name == name or module_name.startswith(name + ".")
