"""Helpers for testing code that uses sa_jobs.

``import sa_jobs.testing`` needs neither pytest nor Hypothesis:

* :func:`assert_enqueued`, :func:`assert_not_enqueued`, :func:`enqueued_jobs`
  (:mod:`sa_jobs.testing.asserts`): assertions about the jobs a test's session sees,
  its uncommitted ones included;
* :func:`run_jobs` (:mod:`sa_jobs.testing.inline`): work due jobs in the test's
  transaction with the application's real handlers;
* :func:`migrated_database` (:mod:`sa_jobs.testing.database`): a throwaway database with
  sa_jobs' schema.

The pytest fixtures built on them are in :mod:`sa_jobs.testing.plugin`, loaded by pytest
through sa_jobs' ``pytest11`` entry point. The Hypothesis strategies and unique-key
helpers of :mod:`sa_jobs.testing.strategies` are re-exported here too, and need
Hypothesis (``pip install 'sa-jobs[testing]'``) when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sa_jobs.testing.asserts import (
    WAITING_STATES,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
)
from sa_jobs.testing.database import migrated_database
from sa_jobs.testing.inline import (
    InlineUsageError,
    MaxRunsExceededError,
    RunSummary,
    run_jobs,
)

if TYPE_CHECKING:
    from sa_jobs.testing.strategies import (
        COMMON_DURATIONS,
        any_floats,
        any_text,
        args_values,
        assert_same_args,
        aware_datetimes,
        canonical_unique_key,
        durations,
        fixed_offsets,
        incomplete_unique_states,
        storable_floats,
        storable_text,
        unique_key,
        unique_opts,
        unique_states,
        unstorable_reason,
        values_for_type,
    )

#: Names of :mod:`sa_jobs.testing.strategies`, imported on first use: the plugin and
#: the assertions must work where Hypothesis is not installed.
_STRATEGIES = frozenset(
    {
        "COMMON_DURATIONS",
        "any_floats",
        "any_text",
        "args_values",
        "assert_same_args",
        "aware_datetimes",
        "canonical_unique_key",
        "durations",
        "fixed_offsets",
        "incomplete_unique_states",
        "storable_floats",
        "storable_text",
        "unique_key",
        "unique_opts",
        "unique_states",
        "unstorable_reason",
        "values_for_type",
    }
)


def __getattr__(name: str) -> Any:
    if name in _STRATEGIES:
        # Raises ImportError saying to install Hypothesis when it is missing.
        return getattr(importlib.import_module("sa_jobs.testing.strategies"), name)
    raise AttributeError(f"module 'sa_jobs.testing' has no attribute {name!r}")


__all__ = [
    "COMMON_DURATIONS",
    "WAITING_STATES",
    "InlineUsageError",
    "MaxRunsExceededError",
    "RunSummary",
    "any_floats",
    "any_text",
    "args_values",
    "assert_enqueued",
    "assert_not_enqueued",
    "assert_same_args",
    "aware_datetimes",
    "canonical_unique_key",
    "durations",
    "enqueued_jobs",
    "fixed_offsets",
    "incomplete_unique_states",
    "migrated_database",
    "run_jobs",
    "storable_floats",
    "storable_text",
    "unique_key",
    "unique_opts",
    "unique_states",
    "unstorable_reason",
    "values_for_type",
]
