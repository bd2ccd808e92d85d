"""``PeriodicJob``: what to insert, on which schedule, and what to do about missed runs.

Everything is checked when the object is built (a bad cron expression, time zone,
interval, catch-up mode or insert option fails at the line that made it), and
:func:`check_periodic_jobs` refuses two periodic jobs with one name when a ``Worker``
is built — before anything is written.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from sa_jobs._declare.args import encode_args, kind_of
from sa_jobs._declare.option_checks import check_text
from sa_jobs._declare.options import InsertOpts
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError
from sa_jobs.periodic.plan import CATCH_UP_MODES, CatchUp, Fire
from sa_jobs.periodic.schedule import Schedule, build_schedule

__all__ = ["DEFAULT_MISFIRE_GRACE", "METADATA_KEY", "PeriodicJob", "check_periodic_jobs"]

#: How late an instant may fire and still count as on time (not missed).
DEFAULT_MISFIRE_GRACE = dt.timedelta(seconds=60)
#: The key of the job's metadata that says which periodic job and instant it is for.
METADATA_KEY = "periodic"
MAX_NAME_LENGTH = 200


class PeriodicJob:
    """A job inserted on a schedule by the workers given it (``Worker(periodic=[...])``).

    Args:
        schedule: A cron expression (5 fields, or 6 with seconds first; evaluated as
            Debian's cron does, DST included) or a ``datetime.timedelta`` of at least
            one second (counted from the first fire, kept across restarts).
        args: A job args instance, or a zero-argument callable returning one (called
            at each fire; an args class with defaults for every field is one).
        name: The periodic job's identity in the database: its schedule state is kept
            under this name, so keep it stable across deploys.
        queue: The jobs' queue (default: the args class's, else ``"default"``).
        run_on_start: Fire once right away when the schedule is new to the database
            (first deploy, or a changed schedule) instead of waiting for its first
            instant. Not at every process start: see ``docs/periodic-jobs.md``.
        catch_up: What to do with instants missed while no worker ran: ``"skip"``
            (none), ``"once"`` (one job for them all) or ``"all"`` (one each, at most
            1,000, the most recent).
        tz: The cron expression's time zone (an IANA name or a ``tzinfo``); default UTC.
        misfire_grace: An instant less than this late still fires under every
            ``catch_up`` mode (default 60 s): the ticker was just late, nothing was
            missed.
        opts: Insert options for the jobs (priority, max_attempts, tags, metadata,
            unique, ...); ``scheduled_at`` is the ticker's to set.

    Raises:
        InvalidOptionsError: any of the above is out of range or unknown.
        InvalidJobArgsError: ``args`` is neither a job args instance nor a callable.
    """

    def __init__(
        self,
        schedule: str | dt.timedelta,
        args: object | Callable[[], object],
        *,
        name: str,
        queue: str | None = None,
        run_on_start: bool = False,
        catch_up: CatchUp = "skip",
        tz: str | dt.tzinfo | None = None,
        misfire_grace: dt.timedelta = DEFAULT_MISFIRE_GRACE,
        opts: InsertOpts | None = None,
    ) -> None:
        self.name = _check_name(name)
        self.schedule: Schedule = build_schedule(schedule, tz)
        if catch_up not in CATCH_UP_MODES:
            raise InvalidOptionsError(
                "catch_up", f"must be 'skip', 'once' or 'all', got {catch_up!r}"
            )
        self.catch_up: CatchUp = catch_up
        if not isinstance(run_on_start, bool):
            raise InvalidOptionsError("run_on_start", f"must be a bool, got {run_on_start!r}")
        self.run_on_start = run_on_start
        if not isinstance(misfire_grace, dt.timedelta) or misfire_grace < dt.timedelta(0):
            raise InvalidOptionsError(
                "misfire_grace", f"must be a timedelta of zero or more, got {misfire_grace!r}"
            )
        self.misfire_grace = misfire_grace
        self.opts = _check_opts(opts, queue)
        self._args, self._factory = _args_or_factory(args)

    def __repr__(self) -> str:
        return f"PeriodicJob({self.schedule.description!r}, name={self.name!r})"

    def build_args(self) -> object:
        """The args of the next job (the factory's answer, checked like any insert).

        Raises:
            InvalidJobArgsError: the factory returned something that is not job args.
        """
        if self._factory is None:
            return self._args
        args = self._factory()
        encode_args(args)
        return args

    def insert_opts(self, fire: Fire) -> InsertOpts:
        """The options of the job for ``fire``: its instant as ``scheduled_at`` and, in
        the metadata, which periodic job and instant it stands for."""
        note: dict[str, Any] = {"name": self.name, "instant": fire.instant.isoformat()}
        if fire.missed:
            note["missed"] = fire.missed
        if fire.requested:
            note["run_now"] = True
        metadata = {**(self.opts.metadata or {}), METADATA_KEY: note}
        return attrs.evolve(self.opts, scheduled_at=fire.instant, metadata=metadata)


def check_periodic_jobs(jobs: Iterable[object]) -> list[PeriodicJob]:
    """The worker's ``periodic=`` list, checked: PeriodicJob objects with distinct names.

    Raises:
        InvalidOptionsError: not a PeriodicJob, or a name used twice.
    """
    checked: list[PeriodicJob] = []
    seen: dict[str, PeriodicJob] = {}
    for job in jobs:
        if not isinstance(job, PeriodicJob):
            raise InvalidOptionsError(
                "periodic", f"must be a list of sa_jobs.PeriodicJob, got {job!r}"
            )
        if job.name in seen:
            raise InvalidOptionsError(
                "periodic",
                f"two periodic jobs are named {job.name!r} ({seen[job.name]!r} and {job!r}); "
                "the name is the job's identity in the database, give each its own",
            )
        seen[job.name] = job
        checked.append(job)
    return checked


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidOptionsError("name", f"must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidOptionsError(
            "name", f"{name[:40]!r}... is {len(name)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    check_text("name", name)
    return name


def _check_opts(opts: object, queue: str | None) -> InsertOpts:
    if opts is None:
        opts = InsertOpts()
    if not isinstance(opts, InsertOpts):
        raise InvalidOptionsError("opts", f"must be sa_jobs.InsertOpts, got {opts!r}")
    if opts.scheduled_at is not None:
        raise InvalidOptionsError(
            "opts", "scheduled_at is set by the schedule; leave it out of a periodic job's opts"
        )
    if queue is not None:
        if opts.queue is not None and opts.queue != queue:
            raise InvalidOptionsError(
                "queue", f"{queue!r} contradicts opts.queue {opts.queue!r}; give one"
            )
        opts = attrs.evolve(opts, queue=queue)  # the InsertOpts validator checks it
    return opts


def _args_or_factory(args: object) -> tuple[object, Callable[[], object] | None]:
    is_args_instance = not isinstance(args, type) and _declared(args)
    if is_args_instance:
        encode_args(args)  # a value that cannot be stored fails here, not at a tick
        return args, None
    if callable(args):
        _check_callable_without_arguments(args)
        return None, args
    raise InvalidJobArgsError(
        f"a periodic job's args must be a job args instance or a zero-argument callable "
        f"returning one, got {args!r}"
    )


def _check_callable_without_arguments(factory: Callable[..., object]) -> None:
    """A factory that needs arguments would fail at every tick: refuse it now. (A class's
    signature is its ``__init__``'s; a builtin without a signature is given the benefit
    of the doubt.)"""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        signature.bind()
    except TypeError as exc:
        raise InvalidOptionsError(
            "args",
            f"{factory!r} cannot be called with no arguments ({exc}); give a job args "
            "instance, an args class whose fields all have defaults, or a function of "
            "no arguments returning args (e.g. lambda: MyArgs(day='today'))",
        ) from None


def _declared(args: object) -> bool:
    try:
        kind_of(args)
    except InvalidJobArgsError:
        return False
    return True
