"""What every failover test shares: building a :class:`~tests.failover.cluster.Cluster`,
or skipping when this machine cannot — unless ``SA_JOBS_REQUIRE_FAILOVER=1`` (set by
``.ci/run``), which makes that a failure: CI must run them."""

from __future__ import annotations

import os

import pytest

from tests.failover.cluster import Cluster, available

REQUIRE_VARIABLE = "SA_JOBS_REQUIRE_FAILOVER"


def _required() -> bool:
    return os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0")


def build_cluster(*, synchronous: bool) -> Cluster:
    """A fresh primary/standby pair; skips (fails when required) if none can be built:
    the binaries are missing, or ``initdb``/``pg_basebackup``/a start failed."""
    problem = available()
    if problem is None:
        try:
            return Cluster(synchronous=synchronous)
        except (RuntimeError, OSError) as exc:
            problem = f"the primary/standby pair could not be built: {exc}"
    message = f"{problem} (bash .ci/run requires it)"
    if _required():
        pytest.fail(f"{message}, and ${REQUIRE_VARIABLE} requires it")
    pytest.skip(message)
