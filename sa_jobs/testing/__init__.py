"""Helpers for testing code that uses sa_jobs.

``import sa_jobs`` never imports Hypothesis; this package needs it (``pip install
'sa-jobs[testing]'``). :mod:`sa_jobs.testing.strategies` holds the Hypothesis strategies
and unique-key helpers, all re-exported here.
"""

from __future__ import annotations

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

__all__ = [
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
]
