"""Fixtures of the state-machine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sa_jobs.devdb import Server
from tests.helpers import migrated_engine


@pytest.fixture(scope="module")
def machine_engine(pg_server: Server, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A database of the test module's own, migrated to ``heads``."""
    module = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    with migrated_engine(pg_server, f"sa_jobs_{module}") as engine:
        yield engine
