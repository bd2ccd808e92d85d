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

from sa_jobs.cli.common import Parser, UsageError
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.option_checks import check_queue

__all__ = [
    "CONCURRENCY",
    "DEFAULT_CONCURRENCY",
    "LOG_LEVEL",
    "LOG_LEVELS",
    "MIGRATE_TARGET",
    "PROCESSES",
    "QUEUES",
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
    "resolve",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: Concurrency of a queue named without one (``-q mail``): the Worker's own default.
DEFAULT_CONCURRENCY = 10

#: A queue named on the command line, with its concurrency if one was given.
QueueSpec = tuple[str, int | None]


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


def queue_spec(text: str) -> QueueSpec:
    """``NAME`` or ``NAME=CONCURRENCY``: a queue to work, and how many of its jobs at once."""
    name, equals, concurrency = text.strip().partition("=")
    name = name.strip()
    try:
        check_queue(name)
    except InvalidOptionsError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a queue: expected NAME or NAME=CONCURRENCY, e.g. mail=10"
        ) from None
    if not equals:
        return name, None
    try:
        return name, positive_int(concurrency)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the concurrency after '=' must be a whole number of at least 1, "
            "e.g. mail=10"
        ) from None


def _text(text: str) -> str:
    return text


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
