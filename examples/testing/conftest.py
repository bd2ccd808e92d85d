from __future__ import annotations

from collections.abc import Iterator

import pytest
from signup import OUTBOX, Base
from sqlalchemy import Engine


@pytest.fixture(scope="session")
def sa_jobs_engine(sa_jobs_engine: Engine) -> Engine:
    # The plugin's throwaway database has sa_jobs' tables; add the application's.
    Base.metadata.create_all(sa_jobs_engine)
    return sa_jobs_engine


@pytest.fixture(autouse=True)
def empty_outbox() -> Iterator[None]:
    OUTBOX.clear()
    yield
    OUTBOX.clear()
