"""The keyed fetch statement: round-robin across a queue's partition keys, capped per key.

A queue that is fair (``sa_jobs.Queue(n, fair_by=[...])``) or has a limit by key
(``ConcurrencyLimit(..., by_args=[...])``) is fetched with :func:`jobs_fetch_keyed`, one
statement that walks the queue's keys instead of its jobs:

1. **Walk** the distinct keys that have available jobs, in key order, starting after the
   process's *cursor* (the last key its previous fetch took from) and wrapping around to
   the first key once the last is passed; one probe of ``sa_job_partition_idx`` per key
   (a loose index scan, as a recursive CTE), and at most ``:walk_limit`` keys: the batch
   size plus the keys known to be at their limit, which are skipped without reading
   their jobs. So a fetch costs the same whether a key has 10 jobs waiting or 10 million,
   and keys without jobs cost nothing (they are not in the index).
2. **Take** each visited key's first jobs in fetch order (priority, scheduled time, id),
   ``FOR UPDATE SKIP LOCKED``: at most its cap (what a limit by key still allows it) and
   at most its share of the batch (its weight times the batch less one job for each
   other key visited: with many keys one job each, with few enough to fill the batch).
3. **Interleave**: rank each key's jobs 1, 2, ...; order by each job's place in its
   key's round (``(rank - 1) / weight``, a fraction), then by the walk's order; keep the
   batch size (and each limited kind's allowance). So with weights 1, ten keys visited
   give one job each, in key order: A1, B1, C1, ...; a key of weight 3 gives three per
   round, spread through it (A1, B1, A2, A3, A4, B2, ...), so every key visited starts
   its first job before any key starts its second, whatever the weights.
4. **Jobs without a key** (a kind without ``partition_by`` put in this queue) fill what
   the keyed jobs leave of the batch, from the head of the queue in fetch order: only
   among its first ``UNKEYED_WINDOW`` times the batch due jobs, so behind a keyed
   backlog they wait (``docs/queues.md``, "Jobs without a key").

The caller (:func:`sa_jobs.worker.keyed_fetch.fetch_keyed`) moves its cursor to the
last key it took from, so the next fetch starts after it: every key with available jobs
is visited at least once every ``ceil(keys / batch)`` fetches of the process, whatever
the other keys hold (the bound in ``docs/queues.md``, "Fair queues").
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
from sqlalchemy import (
    Integer,
    Numeric,
    Text,
    all_,
    and_,
    bindparam,
    cast,
    column,
    false,
    func,
    literal,
    literal_column,
    not_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate

from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import Features
from sa_jobs.worker.producer import FETCH_ORDER, due_in_queue, fetched_columns, running_values

__all__ = [
    "KEY_TYPE",
    "UNKEYED_WINDOW",
    "KeyedShape",
    "fetched_keyed_columns",
    "jobs_fetch_keyed",
    "next_cursor",
]

_ZERO = literal_column("0", Integer)
_ONE = literal_column("1", Integer)

#: The key column's type: text in code point order (the cursor compares in Python).
KEY_TYPE = Text(collation="C")
#: Jobs without a key are looked for among this many times the batch size of the queue's
#: first due jobs (a bound on what the fallback reads, whatever the keyed backlog).
UNKEYED_WINDOW = 4


def _pairs(keys: str, values: str, name: str, value_type: Any) -> Any:
    """``unnest(:keys, :values)`` as a table of (key, value)."""
    return (
        func.unnest(bindparam(keys, type_=ARRAY(Text)), bindparam(values, type_=ARRAY(value_type)))
        .table_valued(column("key", Text), column("value", value_type))
        .render_derived(name=name)
    )


def fetched_keyed_columns(features: Features) -> tuple[Any, ...]:
    """What the keyed fetch returns: the plain fetch's columns and the partition key."""
    return (*fetched_columns(features), Job.partition_key)


@attrs.frozen
class KeyedShape:
    """What a keyed fetch needs beyond the walk (one statement is built per shape, so a
    queue pays only for what it uses).

    Attributes:
        capped: Limits by key: caps per key, and keys at their limit skipped.
        weighted: Weights per key.
        kinds: Limits by kind: full kinds skipped, limited kinds capped in the batch.
    """

    capped: bool = False
    weighted: bool = False
    kinds: bool = False


@functools.cache
def jobs_fetch_keyed(features: Features, shape: KeyedShape = KeyedShape()) -> ReturningUpdate[Any]:
    """Lock and start up to ``:fetch_limit`` jobs of ``:fetch_queue``, round-robin by key.

    Binds ``:fetch_queue``, ``:fetch_limit``, ``:fetch_worker_id``, ``:fetch_at`` (the
    ``attempted_at`` written; the limits' count time, or None for the database's now),
    ``:cursor`` (the key to start after, or None), ``:walk_limit``, ``:full_keys``
    (skipped), ``:capped_keys``/``:key_caps`` (at most that many jobs of each),
    ``:default_cap`` (any other key), ``:weighted_keys``/``:key_weights`` (others weigh
    1), and the kind allowances of :mod:`.limited_fetch`: ``:full_kinds``,
    ``:capped_kinds``/``:kind_caps``.
    """
    queue = bindparam("fetch_queue", type_=Text)
    cursor = bindparam("cursor", type_=KEY_TYPE)
    available = (state_is(Job.state, JobState.AVAILABLE), Job.queue == queue)

    # 1. The walk: (key, phase, n); phase 0 runs after the cursor, phase 1 from the start.
    seed = select(
        cast(cursor, KEY_TYPE).label("key"),
        _ZERO.label("phase"),
        _ZERO.label("n"),
    ).cte("walk", recursive=True)
    previous = seed.alias("previous")
    after = (
        select(Job.partition_key.label("key"), previous.c.phase.label("phase"))
        .where(*available, Job.partition_key > previous.c.key)
        .order_by(Job.partition_key)
        .limit(_ONE)
    )
    wrapped = (
        select(Job.partition_key.label("key"), _ONE.label("phase"))
        .where(*available, Job.partition_key.is_not(None), previous.c.phase == 0)
        .order_by(Job.partition_key)
        .limit(_ONE)
    )
    following = union_all(after, wrapped).limit(_ONE).lateral("following")
    step = (
        select(following.c.key, following.c.phase, previous.c.n + 1)
        .select_from(previous.join(following, true()))
        .where(
            previous.c.n < bindparam("walk_limit", type_=Integer),
            # Back where this walk began: every key has had its turn.
            not_(and_(following.c.phase == 1, func.coalesce(following.c.key > cursor, false()))),
        )
    )
    walk = seed.union_all(step)

    fetch_limit = bindparam("fetch_limit", type_=Integer)
    visited_from: Any = walk
    cap: Any = None
    weight: Any = literal(1, Integer)
    conditions = [walk.c.n > 0]
    if shape.capped:
        caps = _pairs("capped_keys", "key_caps", "caps", Integer)
        visited_from = visited_from.outerjoin(caps, caps.c.key == walk.c.key)
        cap = func.coalesce(caps.c.value, bindparam("default_cap", type_=Integer))
        conditions.append(walk.c.key != all_(bindparam("full_keys", type_=ARRAY(Text))))
    if shape.weighted:
        weights = _pairs("weighted_keys", "key_weights", "weights", Integer)
        visited_from = visited_from.outerjoin(weights, weights.c.key == walk.c.key)
        weight = func.coalesce(weights.c.value, 1)
    visited = (
        select(
            walk.c.key,
            walk.c.n,
            (cap if cap is not None else fetch_limit).label("cap"),
            weight.label("weight"),
        )
        .select_from(visited_from)
        .where(*conditions)
        .cte("visited")
    )
    # 2. Each key's share: every other key visited gives at least one job in the first
    # round, so one key can use at most the batch less the others' (times its weight).
    # With many keys that is one job each; with few, enough to fill the batch.
    visited_count = select(func.count()).select_from(visited).scalar_subquery()
    share = func.greatest(fetch_limit - visited_count + 1, 1)
    take = visited.c.weight * share if shape.weighted else share
    full_kinds = bindparam("full_kinds", type_=ARRAY(Text))
    kind_filter = [Job.kind != all_(full_kinds)] if shape.kinds else []
    taken = (
        select(Job.id, Job.kind, *FETCH_ORDER[:-1])
        .where(*due_in_queue(features), Job.partition_key == visited.c.key, *kind_filter)
        .order_by(*FETCH_ORDER)
        .limit(func.least(visited.c.cap, take) if shape.capped else take)
        .with_for_update(skip_locked=True)
        .lateral("taken")
    )
    rank = func.row_number().over(partition_by=visited.c.key, order_by=_order_of(taken))
    candidates = (
        select(taken.c.id, taken.c.kind, visited.c.n, visited.c.weight, rank.label("rank"))
        .select_from(visited.join(taken, true()))
        .cte("candidates")
    )
    # 3. Each job's place in its key's round (a key of weight w has w jobs in each,
    # spaced 1/w apart, so the first jobs of all keys come before anyone's second), then
    # walk order; then each limited kind's allowance, then the batch. Integer rounds
    # (``(rank - 1) // weight``) let a heavy key fill a small batch alone.
    round_of = (
        cast(candidates.c.rank - 1, Numeric) / candidates.c.weight
        if shape.weighted
        else candidates.c.rank
    )
    in_turn = (round_of, candidates.c.n, candidates.c.rank)
    if shape.kinds:
        order = func.row_number().over(order_by=in_turn)
        ordered = select(candidates.c.id, candidates.c.kind, order.label("position")).cte("ordered")
        kind_caps = _pairs("capped_kinds", "kind_caps", "kind_caps", Integer)
        kind_rank = func.row_number().over(partition_by=ordered.c.kind, order_by=ordered.c.position)
        kind_ranked = (
            select(
                ordered.c.id,
                ordered.c.position,
                kind_caps.c.value.label("cap"),
                kind_rank.label("r"),
            )
            .select_from(ordered.outerjoin(kind_caps, kind_caps.c.key == ordered.c.kind))
            .subquery("kind_ranked")
        )
        chosen = (
            select(kind_ranked.c.id)
            .where(kind_ranked.c.cap.is_(None) | (kind_ranked.c.r <= kind_ranked.c.cap))
            .order_by(kind_ranked.c.position)
            .limit(fetch_limit)
            .cte("chosen")
        )
    else:
        chosen = select(candidates.c.id).order_by(*in_turn).limit(fetch_limit).cte("chosen")
    # 4. Jobs without a key, from the head of the queue, in what the keyed ones left.
    head = (
        select(Job.id, Job.partition_key)
        .where(*due_in_queue(features), *kind_filter)
        .order_by(*FETCH_ORDER)
        .limit(bindparam("fetch_limit", type_=Integer) * UNKEYED_WINDOW)
        .subquery("head")
    )
    left = func.greatest(
        bindparam("fetch_limit", type_=Integer)
        - select(func.count()).select_from(chosen).scalar_subquery(),
        0,
    )
    unkeyed = (
        select(Job.id)
        .where(
            Job.id.in_(select(head.c.id).where(head.c.partition_key.is_(None))),
            state_is(Job.state, JobState.AVAILABLE),
        )
        .order_by(*FETCH_ORDER)
        .limit(left)
        .with_for_update(skip_locked=True)
        .cte("unkeyed")
    )
    started = union_all(select(chosen.c.id), select(unkeyed.c.id)).cte("started")
    started_at = func.coalesce(bindparam("fetch_at", type_=Job.attempted_at.type), func.now())
    return (
        update(Job)
        .where(Job.id == started.c.id)
        .values(running_values(features, started_at))
        .returning(*fetched_keyed_columns(features))
    )


def _order_of(taken: Any) -> tuple[Any, ...]:
    """The fetch order over the ``taken`` lateral's columns."""
    return (taken.c.priority, taken.c.scheduled_at, taken.c.id)


def next_cursor(cursor: str | None, keys: list[str | None]) -> str | None:
    """Where the next fetch's walk starts: after the last key this one took from.

    The walk took keys after ``cursor`` first (ascending), then wrapped to the smallest;
    so the last key taken is the largest at or below the cursor if the walk wrapped, else
    the largest of all. ``keys``: the partition keys of the jobs fetched. (The column's
    collation is "C": the database orders keys by code point, as Python's ``<`` does.)
    """
    taken = [key for key in keys if key is not None]
    if not taken:
        return cursor
    if cursor is not None:
        wrapped = [key for key in taken if key <= cursor]
        if wrapped:
            return max(wrapped)
    return max(taken)
