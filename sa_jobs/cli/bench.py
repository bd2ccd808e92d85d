"""``sa-jobs bench``: enqueue, drain and latency on a throwaway database; ``--floor`` adds
the raw-SQL floor measured in the same run (:mod:`sa_jobs.benchmark`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from sa_jobs.benchmark import BenchSettings, run
from sa_jobs.benchmark.run import PHASES
from sa_jobs.cli import settings
from sa_jobs.cli.common import CommandError, UsageError, parse_url
from sa_jobs.cli.work import queues_from
from sa_jobs.devdb import Server, find_server

__all__ = ["add_command"]

DEFAULT_JOBS = 10_000
#: Single enqueues and latency samples default to these, or to --jobs if smaller, so a
#: small --jobs makes a short run.
DEFAULT_SINGLES = 1_000
DEFAULT_SAMPLES = 300


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "bench",
        parents=[common],
        help="measure enqueue rates, worked jobs/s and latency on a throwaway database",
        description="Create a throwaway database on the server (--url, $SA_JOBS_DATABASE_URL, "
        "$DATABASE_URL, else the local or an embedded one), install the schema, and measure: "
        "single and bulk enqueue rates (plain, and unique by args), worked no-op jobs/s "
        "with the given queues and "
        "processes, the worker's CPU time per job, enqueue -> handler start latency on an "
        "idle worker, the insert-time args check's cost as a share of an enqueue, and "
        "workflows against plain jobs (a 1,000-step insert, a 1 -> 1,000 -> 1 drain, a "
        "chain's release after each completion). "
        "--floor also runs the raw-SQL floor on the same database and prints "
        "each figure's ratio to it (the unique rates compare with the plain ones). "
        "The drain also reports what it cost the database per worked job: statements and "
        "round trips (counted in the worker processes), WAL bytes (whole server) and the "
        "server's CPU (when the server runs on this host). "
        "The database is dropped at the end; nothing else is "
        "touched. Unlike `work`, these options are read from the command line only.",
    )
    parser.add_argument(
        "--jobs",
        type=settings.positive_int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"jobs enqueued in bulk and drained, per side (default {DEFAULT_JOBS:,})",
    )
    parser.add_argument(
        "--singles",
        type=settings.positive_int,
        default=None,
        metavar="N",
        help=f"jobs enqueued one transaction each (default {DEFAULT_SINGLES:,}, or --jobs "
        "if smaller)",
    )
    parser.add_argument(
        "--samples",
        type=settings.positive_int,
        default=None,
        metavar="N",
        help=f"latency samples (default {DEFAULT_SAMPLES}, or --jobs if smaller)",
    )
    parser.add_argument(
        "-q",
        "--queue",
        dest="queues",
        action="append",
        type=settings.queue_spec,
        default=None,
        metavar="NAME[=N]",
        help="a queue to work, N of its jobs at once per process (repeatable; jobs are "
        f"spread evenly over the queues; default: default={settings.DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--concurrency",
        type=settings.positive_int,
        default=None,
        metavar="N",
        help=f"jobs at once for each queue named without =N (default "
        f"{settings.DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--processes",
        type=settings.positive_int,
        default=1,
        metavar="N",
        help="worker processes draining the jobs (default 1; latency uses one)",
    )
    parser.add_argument(
        "--handler",
        choices=("sync", "async"),
        default="sync",
        help="the no-op handler is a plain function or an async def (default sync)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the raw-SQL floor on the same database, and print the ratios",
    )
    parser.add_argument(
        "--floor-threads",
        type=settings.positive_int,
        default=0,
        metavar="N",
        help="also drain with the workplace's floor (N threads in one process, each "
        "fetching 100 jobs a statement and completing them in one UPDATE; 4 is the "
        "issue's) and with one sa_jobs process at 50, 100, 200 and 500 slots per queue, "
        "and compare sa_jobs' best rate, its worker CPU, and the database's cost per job "
        "at the same fetch size (200 slots: fetches of 100) with the floor's; with the "
        "worked part only",
    )
    parser.add_argument(
        "--only",
        dest="phases",
        action="append",
        choices=PHASES,
        default=None,
        help="run only this part (repeatable; default all): single and bulk enqueues with "
        "the drain (worked), latency, the fair fetches (fetch), the drains under limits, "
        "the workflows (workflows)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the settings, the environment and every figure to FILE as JSON",
    )
    parser.set_defaults(run=_bench, settings=(settings.URL, settings.LOG_LEVEL))


def _bench(options: argparse.Namespace) -> int:
    config = _settings(options)
    if options.json is not None:
        _check_writable(options.json)
    server, own = _server(options.url)
    try:
        report = run(server, config, _progress)
    finally:
        if own:
            server.stop()
    where = report.environment
    queues = ", ".join(f"{name}={n}" for name, n in config.queues.items())
    print(
        f"sa-jobs bench results: {config.jobs:,} jobs drained, {config.singles:,} single enqueues, "
        f"{config.samples:,} latency samples; queues {queues} per process"
    )
    print(
        f"on {where['server']} (database {where['database']}, dropped), PostgreSQL "
        f"{where['postgresql']}; {where['cpus']} CPUs, load average {where['load_average']} "
        f"at start; sa_jobs {where['sa_jobs']}, Python {where['python']}"
    )
    print(report.render())
    if options.json is not None:
        try:
            options.json.write_text(json.dumps(report.as_json(), indent=2) + "\n")
        except OSError as exc:
            raise CommandError(f"cannot write --json {options.json}: {exc.strerror}") from None
    return 0


def _settings(options: argparse.Namespace) -> BenchSettings:
    specs = options.queues or ()
    if any(spec.fair for spec in specs):
        raise UsageError(
            "bench works plain queues; the fair and key-limited fetches have cases of their "
            "own (fetch_fair, fetch_key_limited): drop :fair_by from -q"
        )
    queues = {
        name: value
        for name, value in queues_from(specs, options.concurrency).items()
        if isinstance(value, int)  # every one: no spec is fair, and no own queues are passed
    }
    if not queues:
        queues = {"default": options.concurrency or settings.DEFAULT_CONCURRENCY}
    jobs: int = options.jobs
    return BenchSettings(
        jobs=jobs,
        singles=options.singles or min(DEFAULT_SINGLES, jobs),
        samples=options.samples or min(DEFAULT_SAMPLES, jobs),
        queues=queues,
        processes=options.processes,
        handler=options.handler,
        floor=options.floor,
        floor_threads=options.floor_threads,
        phases=tuple(phase for phase in PHASES if phase in (options.phases or PHASES)),
    )


def _check_writable(path: Path) -> None:
    """Refuse a --json path that cannot be written before minutes of measuring, not after."""
    directory = path.parent
    if path.is_dir():
        raise UsageError(f"--json {path}: is a directory; name a file")
    if not directory.is_dir():
        raise UsageError(f"--json {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--json {path}: not writable")


def _server(raw: str | None) -> tuple[Server, bool]:
    """The server to bench on, and whether it was started here (to stop it after)."""
    if not raw:
        try:
            return find_server(), True
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
    url = parse_url(raw)
    return Server(url, url.render_as_string(hide_password=True)), False


def _progress(message: str) -> None:
    # On stderr, so stdout holds only the results.
    print(f"sa-jobs bench: {message}", file=sys.stderr, flush=True)
