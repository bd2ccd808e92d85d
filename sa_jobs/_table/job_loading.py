"""Detached :class:`~sa_jobs._table.models.Job` objects from Core rows, without the ORM loader.

The worker fetches thousands of jobs a second and hands each one to a handler, detached
from any session. Loading them through a Session (``select(Job).from_statement(...)``)
cost a session and its transaction, the ORM's per-execution compile and result set-up
(a row processor built for every fetch), then an identity-map entry and instrumented
population for every row: about half of a no-op job's CPU in the worker.

A builder from :func:`detached_job_builder` makes, from a row, exactly what that loader
leaves behind once its session has closed: a *detached* instance (it has an identity key
and no session) with the returned columns loaded and every other column unloaded. So
the objects behave the same: plain attribute reads, ``set_committed_value``,
``session.add()`` / ``session.merge()`` into a handler's session, and a
``DetachedInstanceError`` when an unloaded (deferred) column is read. What it skips is
what a detached object never uses: the identity map, load events and attribute events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.attributes import instance_state
from sqlalchemy.orm.instrumentation import manager_of_class

from sa_jobs._table.models import Job

__all__ = ["detached_job_builder"]


def detached_job_builder(
    columns: Sequence[Any],
) -> Callable[[Sequence[Any]], Job[Any]]:
    """A function turning one row of ``columns`` (``sa_job`` columns or ``Job``
    attributes, in that order, as a Core statement returns them: types already converted)
    into a detached ``Job``.

    The row must include the primary key, ``id``.
    """
    configure_mappers()  # the class manager's attribute implementations must exist
    mapper = sa_inspect(Job)
    keys = tuple(
        # A mapped attribute (Job.sequence_key) names its property; a table column is
        # looked up (sa_job.args is Job.args_json).
        prop.key
        if (prop := getattr(column, "property", None)) is not None
        else mapper.get_property_by_column(column).key
        for column in columns
    )
    id_index = keys.index("id")
    manager = manager_of_class(Job)

    def build(row: Sequence[Any]) -> Job[Any]:
        job: Job[Any] = manager.new_instance()  # __new__ and a fresh InstanceState
        # Loaded values go straight into the instance dict, as the ORM loader puts them:
        # no attribute events, nothing recorded as changed.
        job.__dict__.update(zip(keys, row, strict=True))
        # The identity key makes it persistent-detached rather than transient (what
        # mapper.identity_key_from_primary_key returns for a single-column key).
        instance_state(job).key = (Job, (row[id_index],), None)
        return job

    return build
