"""The threads sync handlers run in, and what happens when one of them gets stuck.

Python cannot stop a thread. A sync handler that ignores its timeout (or a cancel, or a
shutdown) is settled by the watchdog after the grace period — the job is failed,
cancelled or given back — but its thread stays inside the handler. The policy:

* **A job always gets a thread.** The pool starts a new thread whenever a job arrives
  and none is idle, so a job dispatched to a free slot starts at once, and its timeout
  (which starts with the handler) can only be one it ran into.
* **Stuck threads are replaced, up to a cap.** While fewer than ``stuck_limit`` threads
  are stuck (default: the worker's total concurrency, so never more than twice as many
  threads as slots), the slot of a settled-but-stuck run is freed at once and the next
  job gets a new thread. Past the cap, the slot stays taken until the thread comes back:
  the worker fetches fewer jobs instead of piling up threads.
* **Stuck threads are reported**: a warning names the job and the thread, the job's
  error says its handler was abandoned, and :attr:`HandlerThreads.stuck` /
  :attr:`HandlerThreads.stuck_total` count them. When the thread returns, it is logged,
  counted out, and goes back to work. :attr:`HandlerThreads.limit_reached` says the cap
  is reached; the heartbeat row carries the figures (``sa-jobs health``, the metrics),
  and ``sa-jobs work --processes N --replace-stuck`` replaces such a process.

Threads are daemons, unlike ``concurrent.futures.ThreadPoolExecutor``'s: a stuck handler
must not keep a stopped worker process alive. Its run was settled already, so
abandoning the thread loses nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sa_jobs.worker.execution import Execution

__all__ = ["HandlerThreads"]

log = logging.getLogger("sa_jobs.worker")

_Work = tuple[Callable[..., Any], Execution, tuple[Any, ...]]


class HandlerThreads:
    """A pool that grows to fit the runs it is given, and accounts for stuck threads.

    Args:
        name: Prefix of the threads' names.
        stuck_limit: How many stuck threads may be replaced before freed slots wait for
            stuck threads to return.
        release_slot: Called with an execution whose slot may be reused now.
    """

    def __init__(
        self, name: str, stuck_limit: int, release_slot: Callable[[Execution], None]
    ) -> None:
        self._name = name
        self.stuck_limit = stuck_limit
        self._release_slot = release_slot
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        #: Threads currently stuck in a handler whose run was settled without them.
        self.stuck = 0
        #: Every thread that ever got stuck.
        self.stuck_total = 0
        #: Stuck threads past the cap: their slots stay taken until they return.
        self.held = 0

    @property
    def stuck_now(self) -> int:
        """Threads stuck in a handler now, whether their slot was freed or not."""
        with self._lock:
            return self.stuck + self.held

    @property
    def limit_reached(self) -> bool:
        """``stuck_limit`` threads are stuck: the next stuck run keeps its slot for good
        (or one already does) — the worker fetches less and less until it restarts."""
        with self._lock:
            stuck = self.stuck + self.held
        return stuck > 0 and stuck >= self.stuck_limit

    def stuck_figures(self) -> tuple[int, int]:
        """``(threads stuck now, stuck_limit)``, for the heartbeat row."""
        return self.stuck_now, self.stuck_limit

    @property
    def size(self) -> int:
        with self._lock:
            return sum(1 for thread in self._threads if thread.is_alive())

    def submit(self, function: Callable[..., Any], execution: Execution, *args: Any) -> None:
        """Run ``function(execution, *args)`` on an idle thread, or on a new one."""
        self.submit_many(function, [execution], *args)

    def submit_many(
        self, function: Callable[..., Any], executions: Sequence[Execution], *args: Any
    ) -> None:
        """Run ``function(execution, *args)`` for each execution, each on a thread of its
        own (an idle one, or a new one); one hand-off for a fetched batch."""
        new: list[threading.Thread] = []
        with self._lock:
            for execution in executions:
                item: _Work = (function, execution, args)
                if self._idle:
                    self._idle -= 1
                    self._work.put(item)
                    continue
                thread = threading.Thread(
                    target=self._run,
                    args=(item,),
                    name=f"{self._name}-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                new.append(thread)
        for thread in new:
            thread.start()

    def settled_without_thread(self, execution: Execution) -> None:
        """The watchdog settled ``execution``; free its slot unless that would pile up
        stuck threads (then it is freed when the thread returns)."""
        with self._lock:
            if not execution.in_handler:
                release = True
            else:
                execution.stuck = True
                self.stuck_total += 1
                if self.stuck < self.stuck_limit:
                    self.stuck += 1
                    execution.counted_stuck = True
                    release = True
                else:
                    execution.slot_held = True
                    self.held += 1
                    release = False
        if execution.stuck:
            log.warning(
                "job %d (%s) is stuck in its handler past its grace period; its run was "
                "settled without it%s",
                execution.job.id,
                execution.job.kind,
                ""
                if release
                else f" and its slot stays taken ({self.stuck_limit} threads are stuck already)",
            )
        if release:
            self._release_slot(execution)

    def shutdown(self) -> None:
        """Ask idle threads to exit; busy ones exit after their current run (or never)."""
        with self._lock:
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)

    def _run(self, item: _Work | None) -> None:
        while item is not None:
            function, execution, args = item
            with self._lock:
                execution.in_handler = True
            try:
                function(execution, *args)
            except Exception:  # run_sync reports handler errors; this is a bug in ours
                log.exception("unexpected error running job %d", execution.job.id)
            finally:
                self._returned(execution)
            with self._lock:
                self._idle += 1
            item = self._work.get()

    def _returned(self, execution: Execution) -> None:
        with self._lock:
            execution.in_handler = False
            if not execution.stuck:
                return
            if execution.counted_stuck:
                self.stuck -= 1
            if execution.slot_held:
                self.held -= 1
            release = execution.slot_held
        started = execution.started if execution.started is not None else time.monotonic()
        log.info(
            "the stuck handler of job %d (%s) returned after %.1f s; its thread is back at work",
            execution.job.id,
            execution.job.kind,
            time.monotonic() - started,
        )
        if release:
            self._release_slot(execution)
