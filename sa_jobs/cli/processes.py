"""``sa-jobs work --processes N``: N worker processes under one parent.

The parent starts each child as ``python -m sa_jobs.cli work ... --processes 1`` (a fresh
interpreter: nothing of the parent's threads, engine or imports is inherited), passes
every SIGTERM/SIGINT it receives on to them, and waits for all of them. It restarts
none — but one: with ``--replace-stuck``, a child whose stuck handler threads reached its
``stuck_thread_limit`` stops itself gracefully and exits :data:`STUCK_EXIT_CODE`, and the
parent starts a fresh child in its place (:func:`watch_stuck`). When any other child ends
that the parent did not ask to stop — it crashed, was killed,
or (without ``--until-idle``) exited on its own — the parent logs it, stops the others
the graceful way (SIGTERM) and exits 1, so that the process manager above it (systemd,
Kubernetes, supervisord) sees the failure and restarts the whole group. Otherwise it
exits 0 once every child exited 0.

The children run in process groups of their own, so a Ctrl-C at a terminal reaches only
the parent, which passes it on once (a second Ctrl-C is then a second signal to each
child: cancel the running jobs). A child whose parent disappears (``kill -9``) notices
within a second and stops the graceful way (:func:`watch_parent`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from sa_jobs.cli.common import CommandError
from sa_jobs.worker import Worker

__all__ = ["PARENT_CHECK_INTERVAL", "STUCK_EXIT_CODE", "supervise", "watch_parent", "watch_stuck"]

log = logging.getLogger("sa_jobs.cli")

#: How often the parent looks for children that ended, and a child for its parent.
POLL_INTERVAL = 0.1
PARENT_CHECK_INTERVAL = 1.0
FORWARDED = (signal.SIGTERM, signal.SIGINT)
#: A worker process that stopped because its handler threads are stuck (``--replace-
#: stuck``): EX_TEMPFAIL, "try again" — a fresh process will do.
STUCK_EXIT_CODE = 75
#: How often a ``--replace-stuck`` process looks at its stuck threads.
STUCK_CHECK_INTERVAL = 0.5


def supervise(
    command: Sequence[str], count: int, until_idle: bool, *, replace_stuck: bool = False
) -> int:
    """Run ``count`` copies of ``command`` until they end; the exit code of the group.
    With ``replace_stuck``, a child that exits :data:`STUCK_EXIT_CODE` is replaced."""
    children: list[subprocess.Popen[bytes]] = []
    stop_requested = False
    signals = 0
    failed = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stop_requested, signals
        stop_requested = True
        signals += 1
        name = signal.Signals(signum).name
        if signals == 1:
            what = (
                "they finish their running jobs; a second SIGINT or SIGTERM (Ctrl-C again) "
                "cancels them"
            )
        else:
            what = "they cancel their running jobs"
        log.info("%s: passing it to %d worker processes (%s)", name, _alive(children), what)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        for _ in range(count):
            if stop_requested:  # a signal while starting: start no more
                break
            # process_group=0: see the module's docstring (Ctrl-C reaches the parent only).
            children.append(subprocess.Popen(list(command), process_group=0))
        log.info(
            "started %d worker processes: pids %s",
            len(children),
            ", ".join(str(child.pid) for child in children),
        )
        ended: set[int] = set()
        while len(ended) < len(children):
            for child in children:
                code = child.poll()
                if code is None or child.pid in ended:
                    continue
                ended.add(child.pid)
                if replace_stuck and code == STUCK_EXIT_CODE and not stop_requested:
                    fresh = subprocess.Popen(list(command), process_group=0)
                    children.append(fresh)
                    log.warning(
                        "worker process %d stopped: its handler threads are stuck "
                        "(stuck_thread_limit reached); started worker process %d in its place",
                        child.pid,
                        fresh.pid,
                    )
                    continue
                expected = stop_requested or (until_idle and code == 0)
                if code == 0 and expected:
                    log.info("worker process %d exited", child.pid)
                    continue
                if stop_requested and -code in FORWARDED:
                    # Killed by the signal passed on before it installed its handlers: it
                    # was still starting (a replacement, say) and had taken no job.
                    log.info("worker process %d was stopped while starting", child.pid)
                    continue
                failed = True
                log.error("worker process %d %s", child.pid, _describe_exit(code))
                if not stop_requested:
                    log.error("stopping the other worker processes (none is restarted)")
                    stop_requested = True
                    for other in children:
                        if other.poll() is None:
                            other.send_signal(signal.SIGTERM)
            time.sleep(POLL_INTERVAL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        # Only reached with children alive if starting one failed: do not orphan them.
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                child.wait()
    return 1 if failed else 0


def _alive(children: Sequence[subprocess.Popen[bytes]]) -> int:
    return sum(1 for child in children if child.poll() is None)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} before it was asked to stop"


def watch_parent(parent_pid: int) -> None:
    """Stop this worker the graceful way (SIGTERM to itself) once ``parent_pid`` is no
    longer its parent: a ``--processes`` parent that was killed cannot pass signals on, and
    children in their own process group would otherwise work on unsupervised."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_INTERVAL)
        log.warning("the --processes parent %d is gone: stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    if os.getppid() != parent_pid:
        # Orphaned before starting (or started by hand with a wrong pid): do not run
        # unsupervised.
        raise CommandError(f"--supervised-by {parent_pid}: that process is not this one's parent")
    threading.Thread(target=watch, name="sa_jobs-parent-watch", daemon=True).start()


def watch_stuck(worker: Worker) -> threading.Event:
    """Stop this worker the graceful way (SIGTERM to itself) once its stuck handler
    threads reach its ``stuck_thread_limit``; the event returned is set then, and the
    command exits :data:`STUCK_EXIT_CODE` (``--replace-stuck``). Its running jobs finish
    first; the stuck threads' runs were settled already."""
    stuck = threading.Event()

    def watch() -> None:
        while not worker.stuck_thread_limit_reached:
            time.sleep(STUCK_CHECK_INTERVAL)
        stuck.set()
        log.error(
            "%d handler threads are stuck (stuck_thread_limit %d reached): stopping this "
            "process to be replaced by a fresh one (--replace-stuck)",
            worker.stuck_threads,
            worker.stuck_thread_limit,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sa_jobs-stuck-watch", daemon=True).start()
    return stuck
