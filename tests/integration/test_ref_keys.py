"""A ``sa_jobs.Ref`` field as a partition key: the key is the referenced row (its table
and primary key as ``table:key``), and limits by that key hold in the real fetch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs
from sa_jobs import ConcurrencyLimit, Ref
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import plan_limits

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")
QUEUE = "ref_keys"


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "refkeys_account"
    id: Mapped[int] = mapped_column(primary_key=True)  # SERIAL


class Line(Base):
    __tablename__ = "refkeys_line"
    order_id: Mapped[str] = mapped_column(primary_key=True)
    number: Mapped[int] = mapped_column(primary_key=True)


@sa_jobs.job_args(kind="test_ref_keys_sync", queue=QUEUE, partition_by=["account"])
class SyncAccount:
    account: Ref[Account]
    n: int = 0


@sa_jobs.job_args(kind="test_ref_keys_line", queue=QUEUE, partition_by=["line"])
class ShipLine:
    line: Ref[Line]


@pytest.fixture
def app_tables(engine: Engine) -> Iterator[None]:
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    yield
    Base.metadata.drop_all(engine)


def keys(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.scalars(select(Job.partition_key).order_by(Job.id)))


def test_a_ref_keys_by_its_table_and_primary_key(engine: Engine, app_tables: None) -> None:
    with Session(engine) as session, session.begin():
        first = Account()
        session.add(first)
        session.flush()
        sa_jobs.insert(session, SyncAccount(Ref.to(first), n=1))
        # The same row by its key, and another job on it: one key.
        sa_jobs.insert(session, SyncAccount(Ref(Account, first.id), n=2))
        # A pending instance: its key comes from the flush that inserts it.
        pending = Account()
        session.add(pending)
        session.add(sa_jobs.enqueue(SyncAccount(Ref.to(pending))))
        session.flush()
        session.add(sa_jobs.enqueue(ShipLine(Ref(Line, ("A-7", 2)))))
        ids = (first.id, pending.id)
    assert keys(engine) == [
        f"refkeys_account:{ids[0]}",
        f"refkeys_account:{ids[0]}",
        f"refkeys_account:{ids[1]}",
        'refkeys_line:["A-7",2]',
    ]


def test_a_limit_by_a_ref_holds_per_row(engine: Engine, app_tables: None) -> None:
    with Session(engine) as session, session.begin():
        accounts = [Account() for _ in range(3)]
        session.add_all(accounts)
        session.flush()
        sa_jobs.insert_many(
            session, [SyncAccount(Ref.to(account), n) for account in accounts for n in range(4)]
        )
        busy = f"refkeys_account:{accounts[0].id}"
    limits = [ConcurrencyLimit(1, queue=QUEUE, by_args=["account"])]
    plan = KeyedQueue(QUEUE, plan_limits(limits, [QUEUE])[QUEUE], weights={busy: 3})
    fetched = fetch_keyed(engine, plan, 10, "test-ref-keys", features=ALL_FEATURES)
    # One job per row, whatever the batch or the weight: the limit is per referenced row.
    assert sorted(Counter(job.partition_key for job in fetched).values()) == [1, 1, 1]
    assert fetch_keyed(engine, plan, 10, "test-ref-keys", features=ALL_FEATURES) == []
