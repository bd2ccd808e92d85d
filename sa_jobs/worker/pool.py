"""The threads sync handlers run in.

Daemon threads, unlike ``concurrent.futures.ThreadPoolExecutor``'s: a handler that
ignores cancellation must not keep a stopped worker process alive. By the time the
process exits, the watchdog has settled any run still stuck in a thread (the job was
failed, cancelled or given back), so abandoning the thread loses nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonThreadPool"]

log = logging.getLogger("sa_jobs.worker")


class DaemonThreadPool:
    def __init__(self, size: int, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        self._work.put((function, args))

    def shutdown(self) -> None:
        """Ask idle threads to exit; busy ones exit after their current task (or never)."""
        for _ in self._threads:
            self._work.put(None)

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            function, args = item
            try:
                function(*args)
            except Exception:  # run_sync reports handler errors; this is a bug in ours
                log.exception("unexpected error in a job thread")
