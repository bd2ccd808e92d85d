"""What a psycopg 3 engine sends, as libpq traces it: for tests that count round trips."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import URL, Engine, event

from tests.helpers import engine_at


@contextlib.contextmanager
def traced_engine(url: URL) -> Iterator[tuple[Engine, Path]]:
    """An engine of one connection whose client messages libpq writes to a file."""
    with (
        tempfile.TemporaryDirectory() as folder,
        engine_at(url, pool_size=1, max_overflow=0) as one,
    ):
        path = Path(folder) / "trace"
        sink = path.open("w")

        @event.listens_for(one, "connect")
        def trace(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.pgconn.trace(sink.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

        try:
            yield one, path
        finally:
            sink.close()


def sent(path: Path) -> list[str]:
    """The client's messages, one a line: its type and what follows it."""
    return [line for line in path.read_text().splitlines() if line.startswith("F\t")]


def round_trips(path: Path) -> int:
    """Queries (simple protocol) and syncs (extended) the client has sent: each waits for
    the server once."""
    return sum(1 for line in sent(path) if line.split("\t")[2] in ("Query", "Sync"))
