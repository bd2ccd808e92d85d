"""A worker's queues: checked when given, and what the worker says about them at start.

``Worker(queues=...)`` must be a mapping of queue names to concurrencies
(:func:`check_worker_queues`; a list of names is refused with the dict form to use).

Two mistakes make jobs wait forever without any error: a handler whose kind defaults
to a queue the worker does not serve (``Worker(engine)`` serves ``"default"``; the kind
says ``queue="mail"``), and a queue name nobody else uses (``-q mial``). At each start
the worker looks for both and logs what it finds, each finding once per
:class:`~sa_jobs.worker.Worker` (a test that drains, moves the clock and drains again
hears it once):

* **A kind's default queue not served here**: a WARNING naming each such kind, its
  queue, the queues this worker serves and the fix — unless another live worker serves
  that queue (a worker type per queue, all sharing one module of handlers), which is
  only worth an INFO line.
* **An unknown queue**: a queue of this worker that no handler's kind or periodic job of
  this worker defaults to, and that no job, worker or queue control names
  (:func:`sa_jobs._act.queues.unknown_queues`) is probably a typo: a WARNING naming the
  queues that are known. The worker still serves it — a new queue's first jobs may be
  inserted after its workers start (see ``docs/dev/decisions.md``).

Both are advice: a database error while looking is logged and the worker starts anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError

from sa_jobs._act.queues import served_queues, unknown_queues
from sa_jobs._declare.option_checks import check_queue
from sa_jobs._declare.queue_config import Queue, concurrency_of
from sa_jobs._inspect.job_counts import oldest_available
from sa_jobs._table.schema import Features
from sa_jobs._table.service_tables import JobQueue, WorkerProcess
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.periodic.definition import PeriodicJob
from sa_jobs.worker.handlers import Handler

__all__ = [
    "DEFAULT_QUEUE",
    "QueueNotes",
    "check_worker_queues",
    "fair_queues",
    "kind_queues",
    "serve_hint",
]

log = logging.getLogger("sa_jobs.worker")

#: The library's default queue: always known, whatever the database holds.
DEFAULT_QUEUE = "default"
#: The typo check reads the job table for a queue nothing else names; on a huge table
#: that is a scan, so it gives up (and says nothing) after this long.
UNKNOWN_CHECK_TIMEOUT_MS = 2_000
#: Known queues named in the typo warning, at most.
KNOWN_LISTED = 20


def check_worker_queues(queues: object) -> dict[str, int]:
    """``Worker(queues=...)`` checked: a mapping of queue names to positive concurrencies.

    Raises:
        InvalidOptionsError: not a mapping (a list of names gets the dict form to use),
            empty, a bad name or a bad concurrency.
    """
    if not isinstance(queues, Mapping):
        if isinstance(queues, str):
            names: list[object] = [queues]
        elif isinstance(queues, Iterable):
            names = list(queues)
        else:
            names = []
        example = {name: 10 for name in names if isinstance(name, str)} or {"default": 10}
        raise InvalidOptionsError(
            "queues",
            f"must map each queue to its concurrency (jobs of it at once), e.g. "
            f"queues={example!r}; got {queues!r}",
        )
    checked = {name: concurrency_of(value) for name, value in queues.items()}
    if not checked:
        raise InvalidOptionsError("queues", "name at least one queue, e.g. {'default': 10}")
    for name, concurrency in checked.items():
        check_queue(name)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOptionsError(
                "queues",
                f"concurrency of queue {name!r} must be a positive int (or sa_jobs.Queue(n, ...))",
            )
    return checked


def fair_queues(queues: Mapping[str, object]) -> dict[str, Queue]:
    """The fair ones of ``Worker(queues=...)``: name -> its :class:`~sa_jobs.Queue`."""
    return {name: q for name, q in queues.items() if isinstance(q, Queue) and q.fair}


def kind_queues(handlers: Iterable[Handler]) -> dict[str, list[str]]:
    """Queue -> the kinds whose jobs go there unless an insert says otherwise."""
    found: dict[str, list[str]] = {}
    for handler in handlers:
        queue = handler.kind.defaults.queue or DEFAULT_QUEUE
        found.setdefault(queue, []).append(handler.kind.name)
    return found


def serve_hint(queues: Mapping[str, int], extra: Iterable[str]) -> str:
    """How to serve ``extra`` besides ``queues``, in Python and on the command line (where
    ``-q`` replaces the worker's queues, so all of them are named)."""
    wanted = dict(queues)
    for queue in extra:
        wanted.setdefault(queue, 10)
    python = "{" + ", ".join(f"{name!r}: {n}" for name, n in wanted.items()) + "}"
    command = " ".join(f"-q {name}={n}" for name, n in wanted.items())
    return f"Worker(engine, queues={python}) (sa-jobs work: {command})"


class QueueNotes:
    """The start-time findings about one worker's queues, each said once."""

    def __init__(self) -> None:
        self._said: set[str] = set()
        #: Queues found known (or already warned about): not looked up again.
        self._settled: set[str] = set()

    def check(
        self,
        engine: Engine,
        *,
        worker_id: str,
        queues: Mapping[str, int],
        handlers: Iterable[Handler],
        periodic: Iterable[PeriodicJob],
    ) -> None:
        """Log what is wrong with ``queues`` (see the module); never raises for a
        database error."""
        by_queue = kind_queues(handlers)
        try:
            self._check_kinds(engine, worker_id, queues, by_queue)
            named_here = set(by_queue) | {p.opts.queue for p in periodic if p.opts.queue}
            self._check_unknown(engine, worker_id, queues, named_here)
        except DBAPIError as exc:
            log.info("could not check the worker's queues (%s); starting anyway", exc.orig)

    def _say(self, level: int, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.log(level, "%s", message)

    def _check_kinds(
        self,
        engine: Engine,
        worker_id: str,
        queues: Mapping[str, int],
        by_queue: Mapping[str, list[str]],
    ) -> None:
        missing = {queue: kinds for queue, kinds in by_queue.items() if queue not in queues}
        if not missing:
            return
        with engine.connect() as connection:
            elsewhere = served_queues(connection, except_worker=worker_id)
        serves = ", ".join(repr(queue) for queue in queues)
        nobody = {queue: kinds for queue, kinds in missing.items() if queue not in elsewhere}
        others = {queue: kinds for queue, kinds in missing.items() if queue in elsewhere}
        if nobody:
            self._say(
                logging.WARNING,
                f"this worker serves queues {serves}, but handles kinds whose jobs go to "
                f"other queues unless an insert says otherwise: {_kinds(nobody)}; no live "
                "worker serves those queues, so such jobs wait as 'available' until one "
                f"does. Serve them: {serve_hint(queues, nobody)}, or start a worker that does",
            )
        if others:
            self._say(
                logging.INFO,
                f"this worker serves queues {serves}; the default queues of {_kinds(others)} "
                "are served by other live workers",
            )

    def _check_unknown(
        self, engine: Engine, worker_id: str, queues: Mapping[str, int], named_here: set[str]
    ) -> None:
        candidates = [
            queue
            for queue in queues
            if queue != DEFAULT_QUEUE and queue not in named_here and queue not in self._settled
        ]
        if not candidates:
            return
        try:
            with engine.begin() as connection:
                connection.execute(
                    select(
                        func.set_config("statement_timeout", str(UNKNOWN_CHECK_TIMEOUT_MS), True)
                    )
                )
                unknown = unknown_queues(connection, candidates)
        except DBAPIError as exc:
            # Most likely the timeout on a huge table: no finding rather than a slow start.
            log.debug("could not tell whether queues %s are known: %s", candidates, exc.orig)
            return
        self._settled.update(candidates)
        if not unknown:
            return
        with engine.connect() as connection:
            known = sorted(
                (_named_queues(connection, worker_id) | named_here | {DEFAULT_QUEUE}) - set(unknown)
            )
        listed = ", ".join(known[:KNOWN_LISTED]) + (", ..." if len(known) > KNOWN_LISTED else "")
        for queue in unknown:
            self._say(
                logging.WARNING,
                f"queue {queue!r} is unknown: no handler's kind or periodic job of this worker "
                "goes there, and no job, worker or queue control names it (a typo?); known "
                f"queues: {listed}. The worker serves it anyway, in case its first jobs are "
                "still to come",
            )


def _kinds(by_queue: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{', '.join(kinds)} -> {queue!r}" for queue, kinds in by_queue.items())


def _named_queues(connection: Connection, worker_id: str) -> set[str]:
    """Queues known without a scan of the job table: those holding available jobs (a
    skip scan of the fetch index), those other workers serve or served, and those with
    queue controls."""
    named = set(oldest_available(connection))
    rows = select(func.unnest(WorkerProcess.queues)).where(WorkerProcess.id != worker_id)
    named.update(connection.scalars(rows.distinct()))
    if Features.of(connection).queue:
        named.update(connection.scalars(select(JobQueue.name)))
    return named
