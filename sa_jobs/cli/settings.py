"""Options that also come from the environment: the table of ``SA_JOBS_*`` variables.

Each :class:`Setting` is one option: its destination in the parsed namespace, the
variables that can set it (first one set wins), how a value is read, and its default.
The parser gives these options no default (``argparse.SUPPRESS``), so an option that was
not typed is simply absent and :func:`resolve` fills it from the environment, then from
the default: the command line wins over the environment, which wins over the default.

A bad value in a variable is refused here, before any command runs, with one line that
names the variable — the same check the option's own value gets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from sa_jobs._base.replicas import DEFAULT_MAX_LAG, ON_LAG
from sa_jobs._declare.option_checks import check_queue
from sa_jobs._declare.queue_config import Queue
from sa_jobs.cli.common import Parser, UsageError
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "CONCURRENCY",
    "DEFAULT_CONCURRENCY",
    "LOG_LEVEL",
    "LOG_LEVELS",
    "MAX_REPLICA_LAG",
    "MIGRATE_TARGET",
    "ON_REPLICA_LAG",
    "PROCESSES",
    "QUEUES",
    "READ_URL",
    "REPLACE_STUCK",
    "REPLICA_SETTINGS",
    "UNTIL_IDLE",
    "URL",
    "WORKER",
    "QueueSpec",
    "Setting",
    "duration",
    "flag",
    "global_options",
    "log_level",
    "positive_int",
    "queue_spec",
    "replica_options",
    "resolve",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: Concurrency of a queue named without one (``-q mail``): the Worker's own default.
DEFAULT_CONCURRENCY = 10


@attrs.frozen
class QueueSpec:
    """A queue named on the command line: ``NAME[=N][:fair_by=F[+F...]]`` or
    ``NAME[=N][:fair_by_metadata=KEY]``.

    Attributes:
        name: The queue.
        concurrency: ``N``, if given.
        fair_by: The args fields a fair queue rotates by (``+`` joins several: a comma
            separates queues in ``$SA_JOBS_QUEUES``).
        fair_by_metadata: Or the metadata key it rotates by.
    """

    name: str
    concurrency: int | None = None
    fair_by: tuple[str, ...] | None = None
    fair_by_metadata: str | None = None

    @property
    def fair(self) -> bool:
        return self.fair_by is not None or self.fair_by_metadata is not None

    def text(self) -> str:
        """The spec as ``-q`` reads it back (a ``--processes`` child's command line)."""
        text = self.name if self.concurrency is None else f"{self.name}={self.concurrency}"
        if self.fair_by is not None:
            text += f":fair_by={'+'.join(self.fair_by)}"
        if self.fair_by_metadata is not None:
            text += f":fair_by_metadata={self.fair_by_metadata}"
        return text


@attrs.frozen
class Setting:
    """One option that an environment variable can also set.

    Args:
        dest: Its attribute on the parsed namespace.
        variables: The environment variables that set it, first set wins.
        read: Turns one text value into the option's value; raises
            ``argparse.ArgumentTypeError`` with a message for a bad one (the same
            function the parser uses as ``type=``).
        default: The value when neither the command line nor the environment gives one.
        many: The option is repeatable (``action="append"``); a variable holds a
            comma-separated list.
        option: How the option is spelled, for the documentation.
    """

    dest: str
    variables: tuple[str, ...]
    read: Callable[[str], Any]
    default: Any
    many: bool = False
    option: str = ""


# ---------------------------------------------------------------------- readers


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def duration(text: str) -> dt.timedelta:
    """A positive duration: a bare number of seconds, or a number with ``s``, ``m``,
    ``h``, ``d`` or ``w`` (``90``, ``90s``, ``5m``, ``1.5h``, ``7d``, ``2w``). The one
    duration syntax of every command."""
    found = _DURATION.match(text.strip().lower())
    if not found or float(found.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use a number of seconds, or a number with s, m, "
            "h, d or w (e.g. 90, 5m, 7d)"
        )
    return dt.timedelta(seconds=float(found.group(1)) * _SECONDS[found.group(2)])


def log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level; use one of {', '.join(LOG_LEVELS)}"
        )
    return level


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def flag(text: str) -> bool:
    """A switch's value in a variable: 1/true/yes/on or 0/false/no/off (or empty)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a switch; use 1/true/yes/on or 0/false/no/off"
    )


#: The fairness options at the end of a ``-q`` value; what comes before them is
#: ``NAME[=N]`` (so a queue name may itself hold a colon).
_FAIR_OPTIONS = re.compile(r"^(?P<head>.*?)(?P<options>(?::(?:fair_by|fair_by_metadata)=[^:]*)*)$")


def _fairness(text: str, options: str) -> dict[str, Any]:
    """``:fair_by=a+b`` / ``:fair_by_metadata=k`` as the :class:`QueueSpec` fields,
    checked as ``sa_jobs.Queue`` checks them."""
    found: dict[str, Any] = {}
    for option in options.split(":")[1:]:
        name, _, value = option.partition("=")
        if name in found:
            raise argparse.ArgumentTypeError(f"{text!r}: {name} is given twice; give it once")
        found[name] = tuple(value.split("+")) if name == "fair_by" else value
    try:
        # The same checks as in code: field names, one metadata key, not both.
        Queue(1, **found)
    except InvalidOptionsError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return found


def queue_spec(text: str) -> QueueSpec:
    """``NAME[=CONCURRENCY]``, optionally followed by ``:fair_by=FIELD[+FIELD...]`` or
    ``:fair_by_metadata=KEY``: a queue to work, how many of its jobs at once, and the key
    a fair queue rotates by (``docs/cli.md``, "Fair queues from the command line")."""
    parts = _FAIR_OPTIONS.match(text.strip())
    assert parts is not None  # every text matches (the options part may be empty)
    name, equals, concurrency = parts.group("head").partition("=")
    name = name.strip()
    try:
        check_queue(name)
    except InvalidOptionsError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a queue: expected NAME or NAME=CONCURRENCY, e.g. mail=10, "
            "optionally with :fair_by=FIELD or :fair_by_metadata=KEY"
        ) from None
    fairness = _fairness(text, parts.group("options"))
    if not equals:
        return QueueSpec(name, None, **fairness)
    try:
        return QueueSpec(name, positive_int(concurrency), **fairness)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the concurrency after '=' must be a whole number of at least 1, "
            "e.g. mail=10"
        ) from None


def _text(text: str) -> str:
    return text


def on_replica_lag(text: str) -> str:
    value = text.strip().lower().replace("-", "_")
    if value not in ON_LAG:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a choice; use one of {', '.join(c.replace('_', '-') for c in ON_LAG)}"
        )
    return value


# ---------------------------------------------------------------------- the table

URL = Setting("url", ("SA_JOBS_DATABASE_URL", "DATABASE_URL"), _text, None, option="--url")
LOG_LEVEL = Setting("log_level", ("SA_JOBS_LOG_LEVEL",), log_level, None, option="--log-level")
WORKER = Setting("app", ("SA_JOBS_WORKER",), _text, None, option="MODULE:ATTRIBUTE")
QUEUES = Setting("queues", ("SA_JOBS_QUEUES",), queue_spec, None, many=True, option="-q/--queue")
CONCURRENCY = Setting(
    "concurrency", ("SA_JOBS_CONCURRENCY",), positive_int, None, option="--concurrency"
)
PROCESSES = Setting("processes", ("SA_JOBS_PROCESSES",), positive_int, 1, option="--processes")
UNTIL_IDLE = Setting("until_idle", ("SA_JOBS_UNTIL_IDLE",), flag, False, option="--until-idle")
REPLACE_STUCK = Setting(
    "replace_stuck", ("SA_JOBS_REPLACE_STUCK",), flag, False, option="--replace-stuck"
)
READ_URL = Setting("read_url", ("SA_JOBS_READ_URL",), _text, None, option="--read-url")
MAX_REPLICA_LAG = Setting(
    "max_replica_lag",
    ("SA_JOBS_MAX_REPLICA_LAG",),
    duration,
    dt.timedelta(seconds=DEFAULT_MAX_LAG),
    option="--max-replica-lag",
)
ON_REPLICA_LAG = Setting(
    "on_replica_lag",
    ("SA_JOBS_ON_REPLICA_LAG",),
    on_replica_lag,
    "fall_back",
    option="--on-replica-lag",
)
#: The settings of a command that can read from a replica.
REPLICA_SETTINGS = (READ_URL, MAX_REPLICA_LAG, ON_REPLICA_LAG)
MIGRATE_TARGET = Setting(
    "target", ("SA_JOBS_MIGRATE_TARGET",), _text, "heads", option="migrate --target"
)


def global_options() -> Parser:
    """The options every command takes, before or after its name.

    The parser is a parent of the top-level parser *and* of every command's parser, so
    ``sa-jobs --url X jobs list`` and ``sa-jobs jobs list --url X`` both work. The
    defaults are ``SUPPRESS``: an option not typed leaves no attribute, so a command's
    parser cannot overwrite what was given before its name, and ``settings.resolve``
    fills the gap from the environment.
    """
    parser = Parser(add_help=False)
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="database URL (default: $SA_JOBS_DATABASE_URL, then $DATABASE_URL)",
    )
    group.add_argument(
        "--log-level",
        type=log_level,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (default: $SA_JOBS_LOG_LEVEL, else INFO "
        "for work and WARNING for the other commands)",
    )
    return parser


def replica_options() -> Parser:
    """``--read-url`` and its guard's options, for the commands that only read."""
    parser = Parser(add_help=False)
    group = parser.add_argument_group("reading from a replica (docs/operations.md)")
    group.add_argument(
        "--read-url",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="a streaming standby of --url's database to read from (default: "
        "$SA_JOBS_READ_URL; none: read --url)",
    )
    group.add_argument(
        "--max-replica-lag",
        type=duration,
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="how far behind the replica may be (default: $SA_JOBS_MAX_REPLICA_LAG, "
        f"else {DEFAULT_MAX_LAG:g}s)",
    )
    group.add_argument(
        "--on-replica-lag",
        type=on_replica_lag,
        default=argparse.SUPPRESS,
        metavar="fall-back|report",
        help="past it: read --url instead (fall-back, the default; "
        "$SA_JOBS_ON_REPLICA_LAG) or read the replica anyway and say so (report)",
    )
    return parser


def resolve(namespace: argparse.Namespace, settings: Sequence[Setting]) -> None:
    """Fill every setting the command line left out from the environment or its default.

    Raises:
        UsageError: a variable holds a value the option would refuse.
    """
    for setting in settings:
        if hasattr(namespace, setting.dest):
            continue
        setattr(namespace, setting.dest, _from_environment(setting))


def _from_environment(setting: Setting) -> Any:
    for variable in setting.variables:
        raw = os.environ.get(variable)
        if not raw or not raw.strip():
            continue
        try:
            if setting.many:
                return [
                    setting.read(item.strip()) for item in raw.split(",") if item.strip()
                ] or None
            return setting.read(raw)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"${variable}: {exc} (fix or unset the variable)") from None
    return setting.default
