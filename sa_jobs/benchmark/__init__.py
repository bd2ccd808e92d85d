"""``sa-jobs bench``: how fast sa_jobs is on this machine, against the raw-SQL floor.

A run enqueues no-op jobs through sa_jobs' insert paths, drains them with
:class:`sa_jobs.Worker` processes, and times enqueue → handler start on an idle worker,
all on a throwaway database. With ``floor=True`` the same work is also done by the
leanest hand-written SQL (:mod:`sa_jobs.benchmark.floor`) in the same run, and every
figure gets its ratio to the floor's. See ``docs/performance.md``.
"""

from __future__ import annotations

from sa_jobs.benchmark.report import Figure, Report
from sa_jobs.benchmark.run import BenchSettings, run

__all__ = ["BenchSettings", "Figure", "Report", "run"]
