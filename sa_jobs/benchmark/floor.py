"""The floor: the same work as sa_jobs, done by the leanest SQL a queue could send.

Hand-written statements on bare psycopg 3 connections, against the same ``sa_job`` table
(same indexes, same insert trigger and ``NOTIFY``) as sa_jobs in the same run, so each
sa_jobs figure can be given as a ratio to what PostgreSQL and psycopg allow:

* single insert: ``INSERT … VALUES … RETURNING id`` and ``COMMIT`` per job on one
  connection (psycopg prepares it after five runs);
* bulk insert: ``INSERT … SELECT FROM unnest(…) RETURNING id``, one statement and one
  transaction per batch;
* worked jobs: per process one thread on one autocommit connection looping fetch
  (``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT n) RETURNING``) → a
  no-op per job → one ``UPDATE`` completing the batch, ``n`` being the queue's
  concurrency, so the floor holds no more jobs at once than the worker may; with
  ``--floor-threads N``, N such threads in one process fetching :data:`THREADS_BATCH`
  a statement (the workplace's floor, :mod:`sa_jobs.benchmark.best_worked`);
* latency: a ``LISTEN`` on the channel the insert trigger notifies, and a fetch on a
  second connection when a notification arrives.

The fetch locks the same rows in the same order through the same index as the worker's,
and writes the same columns; the floor leaves out only what a no-op cannot use (timeouts,
retries, error records). ``docs/performance.md`` says why these floors are fair.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import URL, make_url

from sa_jobs._table.schema import INSERT_CHANNEL
from sa_jobs.benchmark import dbcost

__all__ = [
    "COMPLETE",
    "FETCH",
    "INSERT",
    "INSERT_UNNEST",
    "THREADS_BATCH",
    "FloorInserter",
    "conninfo",
    "floor_latency_process",
    "floor_worker_process",
]

INSERT = "INSERT INTO sa_job (kind, args, queue) VALUES (%s, %s, %s) RETURNING id"

INSERT_UNNEST = (
    "INSERT INTO sa_job (kind, args, queue) "
    "SELECT * FROM unnest(%s::text[], %s::jsonb[], %s::text[]) RETURNING id"
)

# The same work as sa_jobs' fetch: lock due jobs in fetch-index order, mark them running.
FETCH = """
UPDATE sa_job
SET state = 'running', attempt = attempt + 1, attempted_at = now(),
    attempted_by = array_append(coalesce(attempted_by, '{}'::text[]), %(worker)s)
WHERE id IN (
    SELECT id FROM sa_job
    WHERE state = 'available' AND queue = %(queue)s AND scheduled_at <= now()
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, kind, args, attempt
"""

COMPLETE = """
UPDATE sa_job SET state = 'completed', finalized_at = now()
WHERE id = ANY(%s) AND state = 'running'
"""


def conninfo(url: URL | str) -> str:
    """A libpq URI for ``url``, whatever SQLAlchemy driver it names.

    The whole URL is kept (query included), so a server reached over a Unix socket
    (``?host=/path``, as the embedded one is) works too.
    """
    url = make_url(url) if isinstance(url, str) else url
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class FloorInserter:
    """Inserts no-op jobs the floor's way on one connection of its own."""

    def __init__(self, url: URL, kind: str) -> None:
        self.kind = kind
        self.connection = psycopg.connect(conninfo(url))

    def single(self, seq: int, queue: str) -> float:
        """Insert one job in a transaction of its own; return when the commit returned
        (``time.time()``)."""
        self.connection.execute(INSERT, (self.kind, Jsonb({"seq": seq}), queue)).fetchone()
        self.connection.commit()
        return time.time()

    def bulk(self, seqs: Sequence[int], queue: str) -> None:
        """Insert one batch in one statement and one transaction."""
        count = len(seqs)
        args = [Jsonb({"seq": seq}) for seq in seqs]
        self.connection.execute(INSERT_UNNEST, ([self.kind] * count, args, [queue] * count))
        self.connection.commit()

    def close(self) -> None:
        self.connection.close()


def floor_worker_process(
    url: str,
    queues: dict[str, int],
    _handler: str,
    ready: Any,
    go: Event,
    stop: Event,
    results: Any,
    *,
    threads: int = 1,
) -> None:
    """A floor worker process: fetch → no-op → complete, one queue after the other, on
    each of ``threads`` threads (a connection each; 1 by default, as the worker's
    concurrency cap allows).

    Puts its user+system CPU seconds from ``go`` to ``stop``, and the statements and round
    trips it sent meanwhile, on ``results``, as :func:`noop.worker_process` does.
    """
    sent = dbcost.client_counter()
    connections = [psycopg.connect(conninfo(url), autocommit=True) for _ in range(threads)]
    worker = f"floor-{os.getpid()}"
    ready.put(os.getpid())
    go.wait()
    # process_time: user+sys of every thread, to the nanosecond (os.times() counts
    # clock ticks, 10 ms, which a short run of a lean loop can fall entirely within).
    before, counted = time.process_time(), sent()
    if threads == 1:
        _floor_loop(connections[0], worker, queues, stop)
    else:
        running = [
            threading.Thread(target=_floor_loop, args=(connection, worker, queues, stop))
            for connection in connections
        ]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
    after, delta = time.process_time(), sent() - counted
    results.put((after - before, delta.statements, delta.round_trips))
    for connection in connections:
        connection.close()


#: Jobs a statement of the workplace's floor fetches (``--floor-threads``: that many
#: threads in one process, each fetching up to this many, /work/shared/bench/floor.py).
THREADS_BATCH = 100


def _floor_loop(
    connection: psycopg.Connection[Any], worker: str, queues: dict[str, int], stop: Event
) -> None:
    while not stop.is_set():
        fetched = 0
        for queue, limit in queues.items():
            params = {"worker": worker, "queue": queue, "limit": limit}
            rows = connection.execute(FETCH, params).fetchall()
            for _id, _kind, _args, _attempt in rows:
                pass  # the no-op handler
            if rows:
                connection.execute(COMPLETE, ([row[0] for row in rows],))
            fetched += len(rows)
        if not fetched:
            stop.wait(0.005)


def floor_latency_process(
    url: str, queues: dict[str, int], _handler: str, ready: Any, stop: Event, starts: Any
) -> None:
    """A floor worker that waits on ``LISTEN`` and fetches when notified.

    Puts ``(seq, time.time())`` on ``starts`` for each job, where a handler would start.
    """
    info = conninfo(url)
    listen = psycopg.connect(info, autocommit=True)
    work = psycopg.connect(info, autocommit=True)
    listen.execute(f"LISTEN {INSERT_CHANNEL}")
    worker = f"floor-{os.getpid()}"
    for queue, limit in queues.items():  # prepare and warm up
        work.execute(FETCH, {"worker": worker, "queue": queue, "limit": limit}).fetchall()
    ready.put(os.getpid())
    while not stop.is_set():
        for notification in listen.notifies(timeout=0.25):
            queue = notification.payload
            if queue in queues:
                params = {"worker": worker, "queue": queue, "limit": queues[queue]}
                rows = work.execute(FETCH, params).fetchall()
                for _id, _kind, args, _attempt in rows:
                    starts.put((args["seq"], time.time()))
                if rows:
                    work.execute(COMPLETE, ([row[0] for row in rows],))
            if stop.is_set():
                break
    listen.close()
    work.close()
