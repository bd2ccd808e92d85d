"""``sa-jobs stats`` and ``sa-jobs health``: the numbers, and a verdict for probes.

``stats`` prints :func:`sa_jobs.stats` as tables (``--json`` for the whole result).
``health`` prints :func:`sa_jobs.check_health` (the xmin horizon, dead rows, queues no
live worker serves) and exits by its level: 0 ok, 3 warning, 4 critical (``--fail-on
critical`` makes a warning exit 0); 1 and 2 keep their meaning for every command (the
check could not run; a bad option).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from sa_jobs._base.states import JobState
from sa_jobs._inspect.health import Health, HealthLevel, HealthThresholds, check_health
from sa_jobs._inspect.queue_stats import EXACT_LIMIT, QueueStats, Stats, as_dict, stats_through
from sa_jobs.cli import settings
from sa_jobs.cli.common import UsageError, format_table, replica_from, session_from
from sa_jobs.errors import InvalidOptionsError

__all__ = ["EXIT_CODES", "add_commands", "format_health", "format_stats"]

#: ``sa-jobs health``'s exit code for each level.
EXIT_CODES = {HealthLevel.OK: 0, HealthLevel.WARNING: 3, HealthLevel.CRITICAL: 4}

SETTINGS = (settings.URL, settings.LOG_LEVEL)
STATS_SETTINGS = (*SETTINGS, *settings.REPLICA_SETTINGS)


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``stats`` and ``health`` to the top-level subparsers ``commands``."""
    defaults = HealthThresholds()
    limits = argparse.ArgumentParser(add_help=False)
    group = limits.add_argument_group("health thresholds")
    for name, read, what in (
        ("xmin_age", settings.duration, "a transaction has held the xmin horizon this long"),
        ("xmin_xids", settings.positive_int, "the horizon is this many transaction ids old"),
        ("dead_tuples", settings.positive_int, "sa_job has this many dead row versions"),
    ):
        for level in ("warning", "critical"):
            default = getattr(defaults, f"{name}_{level}")
            shown = f"{default.total_seconds():.0f}s" if name == "xmin_age" else f"{default:,}"
            group.add_argument(
                f"--{name.replace('_', '-')}-{level}",
                dest=f"{name}_{level}",
                type=read,
                metavar="N" if read is settings.positive_int else "DURATION",
                help=f"{level} when {what} (default {shown})",
            )
    group.add_argument(
        "--unserved-age-warning",
        dest="unserved_age_warning",
        type=settings.duration,
        metavar="DURATION",
        help="warning when a queue that no live worker serves has had an available job "
        f"waiting this long (default {defaults.unserved_age_warning.total_seconds():.0f}s)",
    )
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print the result as JSON")

    numbers = commands.add_parser(
        "stats",
        parents=[common, output, limits, settings.replica_options()],
        help="jobs per queue and state, oldest available, workers, halted sequences, health",
    )
    numbers.add_argument(
        "--exact-limit",
        type=settings.positive_int,
        default=EXACT_LIMIT,
        metavar="N",
        help="count the jobs of each state exactly up to N, estimate past it "
        f"(default {EXACT_LIMIT:,})",
    )
    numbers.set_defaults(run=_stats, settings=STATS_SETTINGS)

    probe = commands.add_parser(
        "health",
        parents=[common, output, limits],
        help="the xmin horizon, dead job rows and unserved queues; exits 0 ok, 3 warning, "
        "4 critical",
    )
    probe.add_argument(
        "--fail-on",
        choices=("warning", "critical"),
        default="warning",
        help="the lowest level that exits non-zero (default warning)",
    )
    probe.set_defaults(run=_health, settings=SETTINGS)


def _thresholds(options: argparse.Namespace) -> HealthThresholds:
    given = {
        name: value
        for name in (
            "xmin_age_warning",
            "xmin_age_critical",
            "xmin_xids_warning",
            "xmin_xids_critical",
            "dead_tuples_warning",
            "dead_tuples_critical",
            "unserved_age_warning",
        )
        if (value := getattr(options, name, None)) is not None
    }
    try:
        return HealthThresholds(**given)
    except InvalidOptionsError as exc:
        option, _, message = str(exc).partition(": ")
        raise UsageError(f"--{option.replace('_', '-')}: {message}") from None


# ---------------------------------------------------------------------- stats


def _stats(options: argparse.Namespace) -> int:
    thresholds = _thresholds(options)
    replica = replica_from(options)
    try:
        with session_from(options) as session:
            found = stats_through(
                session, replica, exact_limit=options.exact_limit, thresholds=thresholds
            )
    finally:
        if replica is not None:
            replica.sync_engine.dispose()
    if options.json:
        print(json.dumps(as_dict(found), indent=2))
        return 0
    print(format_stats(found))
    if found.replica is not None:
        print(f"\n{found.replica.describe()}")
    return 0


def format_stats(found: Stats) -> str:
    """The human form of :func:`sa_jobs.stats`: queues, workers, sequences, health."""
    states = list(JobState)
    header = ("queue", *(state.value for state in states), "oldest available")
    unserved = set(found.unserved_queues)
    rows = [
        (
            _queue_label(queue, unserved),
            *(_count(queue.counts[s], s in queue.estimated) for s in states),
            _age(queue.oldest_available_age),
        )
        for queue in found.queues.values()
    ]
    rows.append(("total", *(_count(found.totals[s], s in found.estimated) for s in states), ""))
    if found.pending_steps is not None:
        # Workflow steps waiting for their dependencies (pending above is sequences').
        header = (*header, "pending steps")
        rows = [
            (*row, f"{queue.pending_steps or 0:,}")
            for row, queue in zip(rows, found.queues.values(), strict=False)
        ] + [(*rows[-1], f"{found.pending_steps:,}")]
    lines = [format_table(header, rows)]
    if found.pending_steps_capped:
        lines.append(
            f"(pending steps: counted up to {found.exact_limit + 1:,} per queue; see --exact-limit)"
        )
    if found.estimated:
        lines.append(
            f"(~ estimated: more than {found.exact_limit:,} jobs in that state; see --exact-limit)"
        )
    lines.append("")
    if found.workers:
        lines.append(
            format_table(
                ("worker", "host", "pid", "queues", "running", "last heartbeat"),
                [
                    (
                        w.id,
                        w.hostname or "-",
                        str(w.pid) if w.pid is not None else "-",
                        ",".join(w.queues) or "-",
                        str(w.running),
                        f"{_age(w.heartbeat_age)} ago" if w.heartbeat_age is not None else "none",
                    )
                    for w in found.workers
                ],
            )
        )
    else:
        lines.append("no workers")
    lines.append(f"maintenance leader: {found.leader or 'none'}")
    halted = found.halted_sequences
    if halted is not None:
        lines.append(f"halted sequences: {halted.count}")
        lines.extend(
            f"  job {h.job_id} ({h.kind}, queue {h.queue}) {h.state.value}, "
            f"{h.waiting} waiting behind it"
            for h in halted.listed
        )
    lines.append("")
    lines.append(format_health(found.health))
    return "\n".join(lines)


def _queue_label(queue: QueueStats, unserved: set[str]) -> str:
    if queue.paused:
        return f"{queue.name} (paused)"
    if queue.name in unserved:
        return f"{queue.name} (no live worker)"
    return queue.name


def _count(value: int, estimated: bool) -> str:
    return f"~{value:,}" if estimated else f"{value:,}"


def _age(value: dt.timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{value.total_seconds():.1f}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


# ---------------------------------------------------------------------- health


def _health(options: argparse.Namespace) -> int:
    thresholds = _thresholds(options)
    with session_from(options) as session:
        found = check_health(session, thresholds)
    if options.json:
        print(json.dumps(as_dict(found), indent=2))
    else:
        print(format_health(found))
    fail_on = HealthLevel(options.fail_on)
    return EXIT_CODES[found.level] if found.level.rank >= fail_on.rank else 0


def format_health(found: Health) -> str:
    """The verdict, each finding, and the figures behind them."""
    lines = [f"health: {found.level.value.upper()}"]
    lines.extend(f"{f.level.value}: {f.message}" for f in found.findings)
    oldest = found.holders[0] if found.holders else None
    horizon = f"xmin horizon: {found.xmin_xid_age:,} transactions"
    if found.xmin_age is not None:
        horizon += f", {_age(found.xmin_age)}"
    if oldest is not None:
        horizon += f" (oldest holder: {oldest.kind.value} {oldest.name})"
    lines.append(horizon)
    if found.unserved_queues is None:
        lines.append("queues no live worker serves: unknown (this role cannot read sa_job)")
    elif found.unserved_queues:
        lines.append(
            "queues no live worker serves: "
            + ", ".join(
                f"{name} (oldest available {_age(age)})"
                for name, age in found.unserved_queues.items()
            )
        )
    if found.dead_tuples is not None:
        dead = found.dead_tuples
        lines.append(
            f"sa_job: {dead.dead:,} dead row versions, {dead.live:,} live; last vacuum "
            f"{_instant(dead.last_vacuum)}, last autovacuum {_instant(dead.last_autovacuum)}"
        )
    if not found.sees_all_sessions:
        lines.append(
            "other roles' sessions are not visible to this role (grant it pg_monitor); "
            f"oldest running transaction: {found.oldest_xid_age:,} transactions old"
        )
    return "\n".join(lines)


def _instant(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).isoformat(sep=" ", timespec="seconds") if value else "never"
