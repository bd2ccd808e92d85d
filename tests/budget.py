"""How many examples the Hypothesis tests of ``tests/property`` draw.

The default run (``scripts/test.sh``, CI) draws half of each test's full budget: the
state machines cost 10-30 ms a step against the database, and their full budgets took
two minutes of the suite's time. ``SA_JOBS_HYPOTHESIS=full`` draws the full budget (before
a release, after changing what a machine models); a test whose full budget is small
keeps a floor of 10 examples. Every run draws new examples (no fixed seed), so CI keeps
exploring across runs.
"""

from __future__ import annotations

import os

#: Examples never fall below this, whatever the share.
FLOOR = 10


def examples(full: int) -> int:
    """The number of examples to draw for a test whose full budget is ``full``."""
    if os.environ.get("SA_JOBS_HYPOTHESIS", "").strip().lower() == "full":
        return full
    return max(min(full, FLOOR), full // 2)
