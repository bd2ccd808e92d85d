"""``sa_jobs.Queue``: a queue's settings in ``Worker(queues=...)`` beyond a concurrency.

``queues={"default": 10}`` and ``queues={"default": sa_jobs.Queue(10)}`` are the same;
``sa_jobs.Queue(10, fair_by=["tenant_id"])`` makes the queue *fair*: its fetch takes
jobs round-robin across partition keys (:mod:`sa_jobs.worker.keyed_fetch`), optionally
weighted per key. Checked where it is built; nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sa_jobs._declare.partitions import (
    MAX_KEY_LENGTH,
    KeySpec,
    check_field_names,
    check_metadata_key,
    key_spec_of,
)
from sa_jobs.errors import InvalidOptionsError

__all__ = ["MAX_WEIGHT", "Queue"]

#: The largest weight: a key taking more than this many jobs per round is a queue of its own.
MAX_WEIGHT = 1000


def _concurrency(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionsError(
            "concurrency", f"must be a positive int (jobs of the queue at once), got {value!r}"
        )
    return value


def _fields(value: object) -> tuple[str, ...] | None:
    return None if value is None else check_field_names("fair_by", value)


def _metadata_key(value: object) -> str | None:
    return None if value is None else check_metadata_key("fair_by_metadata", value)


def _weights(value: object) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidOptionsError(
            "weights", f"must map partition keys to weights, e.g. {{'acme': 3}}, got {value!r}"
        )
    checked: dict[str, int] = {}
    for key, weight in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise InvalidOptionsError(
                "weights",
                f"keys are partition keys as text (1 to {MAX_KEY_LENGTH} characters), got {key!r}",
            )
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise InvalidOptionsError(
                "weights",
                f"the weight of key {key!r} must be an int from 1 to {MAX_WEIGHT} (jobs per "
                f"round; 1 is every key's default), got {weight!r}; to stop a key's jobs, "
                "cancel them or move them to a paused queue",
            )
        checked[key] = weight
    return checked


@attrs.frozen
class Queue:
    """One queue of a worker: how many of its jobs run at once in this process, and
    whether its fetch is fair across partition keys.

    Attributes:
        concurrency: Jobs of the queue at once in this process (as the plain int form).
        fair_by: The args fields that key the jobs (every kind put in the queue declares
            them with ``job_args(partition_by=...)``): the fetch takes keys in turn.
        fair_by_metadata: Or the metadata key that keys the jobs (the kinds declare
            ``job_args(partition_by_metadata=...)``).
        weights: Partition key text -> jobs per round (default 1 for every key).

    Raises:
        InvalidOptionsError: a concurrency under 1, bad field names, both ``fair_by``
            and ``fair_by_metadata``, weights without either, or a weight that is not
            from 1 to :data:`MAX_WEIGHT`.
    """

    concurrency: int = attrs.field(converter=_concurrency)
    fair_by: tuple[str, ...] | None = attrs.field(default=None, converter=_fields, kw_only=True)
    fair_by_metadata: str | None = attrs.field(default=None, converter=_metadata_key, kw_only=True)
    weights: dict[str, int] = attrs.field(
        factory=dict, converter=_weights, kw_only=True, hash=False
    )

    def __attrs_post_init__(self) -> None:
        spec = self.key_spec  # refuses fair_by and fair_by_metadata together
        if self.weights and spec is None:
            raise InvalidOptionsError(
                "weights",
                "weigh keys of a fair queue: add fair_by=[...] (the key's fields) or "
                "fair_by_metadata='...'",
            )

    @property
    def key_spec(self) -> KeySpec | None:
        """What the queue rotates by, if it is fair."""
        return key_spec_of(self.fair_by, self.fair_by_metadata, "fair_by", "fair_by_metadata")

    @property
    def fair(self) -> bool:
        return self.key_spec is not None

    def fairness(self) -> str:
        """The key as written (``fair_by=['tenant_id']``), with any weights; "" if plain."""
        spec = self.key_spec
        if spec is None:
            return ""
        weights = f", weights={self.weights!r}" if self.weights else ""
        return spec.describe("fair_by", "fair_by_metadata") + weights


def concurrency_of(value: Any) -> Any:
    """A ``queues=`` value's concurrency: the int, or a :class:`Queue`'s."""
    return value.concurrency if isinstance(value, Queue) else value
