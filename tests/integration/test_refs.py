"""``sa_jobs.Ref``: references to ORM rows in job args, against a real database — the
stored form, pending instances written in one flush, load/get in both session kinds,
and bad input refused before anything is written."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import attrs
import pytest
from sqlalchemy import Engine, ForeignKey, String, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs
from sa_jobs import Job, Ref
from sa_jobs.errors import InvalidJobArgsError, RowMissingError
from tests.helpers import count_jobs, make_worker


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "refs_customer"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String, default="")


class Invoice(Base):
    __tablename__ = "refs_invoice"
    id: Mapped[int] = mapped_column(primary_key=True)  # SERIAL
    total: Mapped[int] = mapped_column(default=0)


class InvoiceLine(Base):
    __tablename__ = "refs_invoice_line"
    invoice_id: Mapped[int] = mapped_column(ForeignKey("refs_invoice.id"), primary_key=True)
    number: Mapped[int] = mapped_column(primary_key=True)


class NotMapped:
    pass


@sa_jobs.job_args(kind="refs_send_invoice")
class SendInvoice:
    invoice: Ref[Invoice]
    reminder: bool = False


@sa_jobs.job_args(kind="refs_many")
class Many:
    customer: Ref[Customer]
    lines: list[Ref[InvoiceLine]] = sa_jobs.field(factory=list)
    maybe: Ref[Invoice] | None = None


@pytest.fixture
def app_tables(engine: Engine) -> Iterator[None]:
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    yield
    Base.metadata.drop_all(engine)


def stored_args(engine: Engine, job_id: int) -> object:
    with engine.connect() as connection:
        return connection.scalar(text("SELECT args FROM sa_job WHERE id = :id"), {"id": job_id})


# ------------------------------------------------------------------ the stored form


def test_a_ref_is_stored_as_its_table_and_primary_key(engine: Engine, app_tables: None) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        customer = Customer(name="c")
        invoice = Invoice(total=3)
        session.add_all([customer, invoice])
        session.flush()
        line = InvoiceLine(invoice_id=invoice.id, number=2)
        session.add(line)
        session.flush()
        job = sa_jobs.enqueue(
            Many(customer=customer, lines=[Ref.to(line)], maybe=Ref(Invoice, invoice.id))
        )
        session.add(job)
    assert stored_args(engine, job.id) == {
        "customer": {"table": "refs_customer", "pk": [str(customer.id)]},
        "lines": [{"table": "refs_invoice_line", "pk": [invoice.id, 2]}],
        "maybe": {"table": "refs_invoice", "pk": [invoice.id]},
    }
    with Session(engine) as session:
        loaded = session.get(Job, job.id)
        assert loaded is not None
        args: Many = loaded.args
        assert args.customer == Ref(Customer, customer.id)
        assert args.lines == [Ref(InvoiceLine, (invoice.id, 2))]
        assert args.customer.load(session).name == "c"
        assert args.lines[0].load(session).number == 2


# ------------------------------------------------------------------ pending instances


def test_a_pending_instance_gets_its_key_in_the_same_flush(
    engine: Engine, app_tables: None
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoice = Invoice(total=10)  # no key yet: SERIAL gives it one at the flush
        session.add(invoice)
        job = sa_jobs.enqueue(SendInvoice(invoice=invoice))
        session.add(job)
        assert invoice.id is None
        session.flush()
        assert invoice.id is not None and job.id is not None
        assert job in session
        assert job.args.invoice.load(session) is invoice
        flushed_id = invoice.id
    assert stored_args(engine, job.id) == {
        "invoice": {"table": "refs_invoice", "pk": [flushed_id]},
        "reminder": False,
    }


def test_a_rollback_leaves_neither_the_instance_nor_the_job(
    engine: Engine, app_tables: None
) -> None:
    with Session(engine) as session:
        invoice = Invoice()
        session.add(invoice)
        job = sa_jobs.enqueue(SendInvoice(invoice=invoice))
        session.add(job)
        session.flush()
        session.rollback()
        assert job not in session
    assert count_jobs(engine) == 0


def test_jobs_and_instances_mixed_in_one_flush(engine: Engine, app_tables: None) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoices = [Invoice(total=n) for n in range(3)]
        session.add_all(invoices)
        jobs = [sa_jobs.enqueue(SendInvoice(invoice=inv)) for inv in invoices]
        plain = sa_jobs.enqueue(SendInvoice(invoice=Ref(Invoice, 12345)))
        session.add_all([*jobs, plain])
    with Session(engine) as session:
        for invoice, job in zip(invoices, jobs, strict=True):
            loaded = session.get(Job, job.id)
            assert loaded is not None
            assert loaded.args.invoice == Ref(Invoice, invoice.id)


# ------------------------------------------------------------------ load and get


def test_load_and_get(engine: Engine, app_tables: None) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(Invoice(id=5, total=1))
    with Session(engine) as session:
        assert Ref(Invoice, 5).load(session).total == 1
        assert Ref(Invoice, 5).load(session, for_update=True).total == 1
        assert Ref(Invoice, 6).get(session) is None
        with pytest.raises(RowMissingError, match=r"Invoice 6 does not exist"):
            Ref(Invoice, 6).load(session)


def test_load_and_get_with_an_async_session(database_url: object, app_tables: None) -> None:
    import asyncio

    from sqlalchemy.engine import URL

    assert isinstance(database_url, URL)

    async def main() -> None:
        engine = create_async_engine(database_url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(engine) as session, session.begin():
                session.add(Invoice(id=8, total=4))
            async with AsyncSession(engine) as session:
                assert (await Ref(Invoice, 8).load(session, for_update=True)).total == 4
                assert await Ref(Invoice, 9).get(session) is None
        finally:
            await engine.dispose()

    asyncio.run(main())


# ------------------------------------------------------------------ bad input


def test_a_ref_to_an_unmapped_class_is_refused_at_declaration() -> None:
    with pytest.raises(InvalidJobArgsError, match="not a mapped SQLAlchemy class"):

        @sa_jobs.job_args(kind="refs_bad_unmapped")
        class Bad:
            thing: Ref[NotMapped]

    with pytest.raises(InvalidJobArgsError, match="bare Ref"):

        @sa_jobs.job_args(kind="refs_bad_bare")
        class Bare:
            thing: Ref  # type: ignore[type-arg]

    with pytest.raises(InvalidJobArgsError, match="not a mapped SQLAlchemy class"):
        Ref(NotMapped, 1)


@pytest.mark.parametrize(
    ("model", "pk", "message"),
    [
        (Invoice, "7", r"id is '7' \(str\); the column holds int"),
        (Invoice, True, r"id is True \(bool\); the column holds int"),
        (Invoice, (1, 2), r"primary key has 1 column\(s\) \(id\)"),
        (InvoiceLine, 1, r"primary key has 2 column\(s\) \(invoice_id, number\)"),
        (Customer, 1, r"the column holds UUID"),
        (Invoice, None, r"id is None"),
    ],
)
def test_a_key_of_the_wrong_type_or_arity_is_refused(model: type, pk: object, message: str) -> None:
    with pytest.raises(InvalidJobArgsError, match=message):
        Ref(model, pk)


def test_bad_references_are_refused_at_enqueue_and_nothing_is_written(
    engine: Engine, app_tables: None
) -> None:
    with Session(engine) as session:
        customer = Customer(name="x")
        session.add(customer)
        session.flush()
        # An instance of another model.
        with pytest.raises(
            InvalidJobArgsError, match=r"reference to Customer given for a Ref\[Invoice\]"
        ):
            sa_jobs.enqueue(SendInvoice(invoice=customer))  # type: ignore[arg-type]
        # Not a reference at all.
        with pytest.raises(InvalidJobArgsError, match=r"given for a Ref\[Invoice\]"):
            sa_jobs.enqueue(SendInvoice(invoice=7))  # type: ignore[arg-type]
        # A transient instance with no key and no session.
        with pytest.raises(InvalidJobArgsError, match="in no session"):
            sa_jobs.enqueue(SendInvoice(invoice=Invoice()))
        # insert() writes at once: a pending instance has no key to write.
        pending = Invoice()
        session.add(pending)
        with pytest.raises(InvalidJobArgsError, match="no primary key yet"):
            sa_jobs.insert(
                session,
                SendInvoice(invoice=Ref.to(pending)),
            )
        session.expunge(pending)
        # Still usable.
        session.add(Invoice(id=77))
        session.commit()
    assert count_jobs(engine) == 0
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Invoice)) == 1


def test_a_pending_instance_of_another_session_is_refused_at_flush(
    engine: Engine, app_tables: None
) -> None:
    with Session(engine) as other, Session(engine) as session:
        invoice = Invoice()
        other.add(invoice)
        session.add(sa_jobs.enqueue(SendInvoice(invoice=invoice)))
        with pytest.raises(InvalidJobArgsError, match="not pending in the session flushing"):
            session.flush()
        session.rollback()
        session.add(Invoice(id=3))
        session.commit()
    assert count_jobs(engine) == 0


# ------------------------------------------------------------------ when the row is gone


@sa_jobs.job_args(kind="refs_worker_cancel", max_attempts=5)
class Bill:
    invoice: Ref[Invoice]


@sa_jobs.job_args(kind="refs_worker_discard", max_attempts=5)
class BillOrDiscard:
    invoice: Ref[Invoice] = sa_jobs.field(on_missing="discard")


@sa_jobs.job_args(kind="refs_worker_run", max_attempts=5)
class BillAnyway:
    invoice: Ref[Invoice] = sa_jobs.field(on_missing="run")


def enqueue_for(engine: Engine, *args: object) -> list[int]:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        jobs = [sa_jobs.enqueue(item) for item in args]
        session.add_all(jobs)
    return [job.id for job in jobs]


def job_row(engine: Engine, job_id: int) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


@pytest.mark.parametrize("how", ["orm", "bulk"])
def test_a_deleted_row_cancels_its_job_with_the_reason_and_no_retry(
    engine: Engine, app_tables: None, how: str
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        kept, gone = Invoice(total=1), Invoice(total=2)
        session.add_all([kept, gone])
        session.flush()
        session.add_all([sa_jobs.enqueue(Bill(invoice=kept)), sa_jobs.enqueue(Bill(invoice=gone))])
    kept_job, gone_job = [job.id for job in _jobs_in_order(engine)]
    with Session(engine) as session, session.begin():
        if how == "orm":
            session.delete(session.get(Invoice, gone.id))
        else:  # outside the ORM: no event sees it
            session.execute(text("DELETE FROM refs_invoice WHERE id = :id"), {"id": gone.id})
    seen: list[Ref[Invoice]] = []
    worker = make_worker(engine)

    @worker.handler(Bill)
    def bill(job: Job[Bill], session: Session) -> None:
        seen.append(job.args.invoice)
        assert job.args.invoice.load(session).total == 1

    worker.run_until_idle()
    assert seen == [Ref(Invoice, kept.id)]
    assert job_row(engine, kept_job).state == sa_jobs.JobState.COMPLETED
    cancelled = job_row(engine, gone_job)
    assert cancelled.state == sa_jobs.JobState.CANCELLED
    assert cancelled.attempt == 1
    assert len(cancelled.errors) == 1
    assert cancelled.errors[0]["error"] == (
        f"JobCancel: Invoice {gone.id} (table 'refs_invoice') no longer exists "
        "(on_missing='cancel')"
    )


def _jobs_in_order(engine: Engine) -> list[Job]:
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def test_on_missing_discard_and_run(engine: Engine, app_tables: None) -> None:
    discard_id, run_id = enqueue_for(
        engine, BillOrDiscard(invoice=Ref(Invoice, 404)), BillAnyway(invoice=Ref(Invoice, 404))
    )
    got: list[object] = []
    worker = make_worker(engine)

    @worker.handler(BillOrDiscard)
    def discard(job: Job[BillOrDiscard]) -> None:  # no session: checked in its own
        raise AssertionError("must not run")

    @worker.handler(BillAnyway)
    def anyway(job: Job[BillAnyway], session: Session) -> None:
        got.append(job.args.invoice.get(session))

    worker.run_until_idle()
    discarded = job_row(engine, discard_id)
    assert discarded.state == sa_jobs.JobState.DISCARDED
    assert discarded.attempt == 1 and discarded.max_attempts == 5
    assert "Invoice 404 (table 'refs_invoice') no longer exists" in discarded.errors[0]["error"]
    assert job_row(engine, run_id).state == sa_jobs.JobState.COMPLETED
    assert got == [None]


def test_an_async_handler_is_checked_too(engine: Engine, app_tables: None) -> None:
    (job_id,) = enqueue_for(engine, Bill(invoice=Ref(Invoice, 405)))
    worker = make_worker(engine)

    @worker.handler(Bill)
    async def bill(job: Job[Bill], session: AsyncSession) -> None:
        raise AssertionError("must not run")

    worker.run_until_idle()
    assert job_row(engine, job_id).state == sa_jobs.JobState.CANCELLED


# ------------------------------------------------------------------ jobs_for


def test_jobs_for_finds_the_jobs_that_reference_a_row(engine: Engine, app_tables: None) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        one, two = Invoice(total=1), Invoice(total=2)
        customer = Customer(name="c")
        session.add_all([one, two, customer])
        session.flush()
        line = InvoiceLine(invoice_id=one.id, number=3)
        session.add(line)
        jobs = [
            sa_jobs.enqueue(SendInvoice(invoice=one)),
            sa_jobs.enqueue(SendInvoice(invoice=two)),
            sa_jobs.enqueue(Many(customer=customer, lines=[Ref.to(line)], maybe=Ref.to(one))),
        ]
        session.add_all(jobs)
    with Session(engine) as session:
        assert [job.id for job in sa_jobs.jobs_for(session, one)] == [jobs[0].id, jobs[2].id]
        assert [job.id for job in sa_jobs.jobs_for(session, Ref(Invoice, two.id))] == [jobs[1].id]
        assert [job.id for job in sa_jobs.jobs_for(session, customer)] == [jobs[2].id]
        assert [job.id for job in sa_jobs.jobs_for(session, line)] == [jobs[2].id]
        assert sa_jobs.jobs_for(session, Ref(Invoice, 999)) == []
        assert sa_jobs.jobs_for(session, one, states=["completed"]) == []
        assert len(sa_jobs.jobs_for(session, one, states=[sa_jobs.JobState.AVAILABLE])) == 2


def test_jobs_for_uses_its_index(engine: Engine, app_tables: None) -> None:
    from sa_jobs._inspect.ref_jobs import jobs_for_statement

    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoices = [Invoice(total=n) for n in range(200)]
        session.add_all(invoices)
        session.flush()
        session.add_all(
            [sa_jobs.enqueue(SendInvoice(invoice=inv)) for inv in invoices]
            + [sa_jobs.enqueue(Bill(invoice=Ref(Invoice, n))) for n in range(3000, 3000 + 2000)]
        )
    with engine.begin() as connection:
        connection.execute(text("ANALYZE sa_job"))
        statement = jobs_for_statement("refs_invoice", [invoices[7].id])
        compiled = statement.compile(engine)
        params = {
            name: (json.dumps(value) if name == "ref_pk" else value)
            for name, value in compiled.params.items()
        }
        plan = "\n".join(
            row[0] for row in connection.exec_driver_sql(f"EXPLAIN {compiled}", params)
        )
    assert "sa_job_refs_idx" in plan, plan
    assert "Seq Scan" not in plan, plan


# ------------------------------------------------------------------ locking and sequences


@sa_jobs.job_args(kind="refs_add_one")
class AddOne:
    invoice: Ref[Invoice]


def test_load_for_update_serialises_two_jobs_on_one_row(engine: Engine, app_tables: None) -> None:
    import threading
    import time

    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoice = Invoice(total=0)
        session.add(invoice)
        session.add_all([sa_jobs.enqueue(AddOne(invoice=invoice)) for _ in range(2)])
    spans: list[tuple[float, float, str]] = []
    both_started = threading.Barrier(2, timeout=5)
    worker = make_worker(engine, queues={"default": 2})

    @worker.handler(AddOne)
    def add_one(job: Job[AddOne], session: Session) -> None:
        both_started.wait()  # two threads, each in its own transaction, at once
        row = job.args.invoice.load(session, for_update=True)
        start = time.monotonic()
        seen = row.total
        time.sleep(0.3)
        row.total = seen + 1  # a lost update if the two ran together
        session.flush()
        spans.append((start, time.monotonic(), threading.current_thread().name))

    worker.run_until_idle()
    assert len(spans) == 2 and spans[0][2] != spans[1][2]
    first, second = sorted(spans)
    assert second[0] >= first[1] - 0.01, spans  # the second waited for the first's commit
    with Session(engine) as session:
        assert session.get(Invoice, invoice.id).total == 2  # type: ignore[union-attr]


@sa_jobs.job_args(kind="refs_sequenced", sequence=sa_jobs.SequenceOpts(by_args=True))
class Sequenced:
    invoice: Ref[Invoice] = sa_jobs.field(sequence=True)
    n: int = 0


def test_a_sequence_keyed_by_a_ref_runs_one_job_per_row_at_a_time(
    engine: Engine, app_tables: None
) -> None:
    import threading
    import time

    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoices = [Invoice(total=0) for _ in range(2)]
        session.add_all(invoices)
        session.flush()
        session.add_all(
            [sa_jobs.enqueue(Sequenced(invoice=inv, n=n)) for n in range(3) for inv in invoices]
        )
    lock = threading.Lock()
    running: dict[object, int] = {}
    most: dict[object, int] = {}
    overall: list[int] = []
    order: dict[object, list[int]] = {}
    worker = make_worker(engine, queues={"default": 4})

    @worker.handler(Sequenced)
    def run(job: Job[Sequenced]) -> None:
        key = job.args.invoice
        with lock:
            running[key] = running.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running[key])
            overall.append(sum(running.values()))
            order.setdefault(key, []).append(job.args.n)
        time.sleep(0.15)
        with lock:
            running[key] -= 1

    worker.run_until_idle()
    assert most == {Ref(Invoice, inv.id): 1 for inv in invoices}
    assert all(value == [0, 1, 2] for value in order.values()), order
    assert max(overall) == 2  # the two rows' sequences did run side by side


# ------------------------------------------------------------------ testing strategies


def test_the_testing_strategies_draw_args_with_refs() -> None:
    from hypothesis import given, settings

    from sa_jobs._declare.args import kind_of
    from sa_jobs.testing.strategies import args_values

    @settings(max_examples=50, deadline=None)
    @given(args_values(Many))
    def round_trip(args: Many) -> None:
        _kind, data = sa_jobs._declare.args.encode_args(args)
        assert data["customer"]["table"] == "refs_customer"
        assert kind_of(Many).decode(data) == args

    round_trip()


def test_the_inline_runner_checks_referenced_rows(engine: Engine, app_tables: None) -> None:
    from sa_jobs.testing import run_jobs

    worker = make_worker(engine)

    @worker.handler(Bill)
    def bill(job: Job[Bill], session: Session) -> None:
        raise AssertionError("must not run")

    with Session(engine) as session, session.begin():
        session.add(sa_jobs.enqueue(Bill(invoice=Ref(Invoice, 4242))))
        summary = run_jobs(session, worker)
        assert summary.cancelled == 1


# ------------------------------------------------------------------ the dashboard


def test_the_dashboard_shows_and_filters_by_referenced_rows(
    engine: Engine, app_tables: None
) -> None:
    from sa_jobs.dashboard import create_app
    from tests.dashboard import DashboardClient

    ids = enqueue_for(
        engine,
        SendInvoice(invoice=Ref(Invoice, 7)),
        SendInvoice(invoice=Ref(Invoice, 8)),
        Many(customer=Ref(Customer, uuid.UUID(int=1)), maybe=Ref(Invoice, 7)),
    )
    with DashboardClient(create_app(engine)) as client:
        page = client.get(f"/jobs/{ids[2]}").text
        assert "refs_customer &#34;00000000-0000-0000-0000-000000000001&#34;" in page or (
            'refs_customer "00000000-0000-0000-0000-000000000001"' in page
        )
        assert "/jobs?ref=refs_invoice%3A%5B7%5D" in page
        listed = client.get("/jobs", params={"ref": "refs_invoice:[7]"}).text
        assert f'href="/jobs/{ids[0]}"' in listed and f'href="/jobs/{ids[2]}"' in listed
        assert f'href="/jobs/{ids[1]}"' not in listed
        assert client.get("/jobs", params={"ref": "refs_invoice:7"}).status_code == 400


# ------------------------------------------------------------------ keys and nesting


@sa_jobs.job_args(kind="refs_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class RemindOnce:
    invoice: Ref[Invoice] = sa_jobs.field(unique=True)
    note: str = ""


def test_a_unique_key_on_a_ref_is_the_table_and_key(engine: Engine, app_tables: None) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        invoice = Invoice(total=5)
        session.add(invoice)
        session.flush()
        first = sa_jobs.insert(session, RemindOnce(invoice=invoice, note="a"))
        # The same row by key, with the instance changed: still a duplicate.
        invoice.total = 6
        again = sa_jobs.insert(session, RemindOnce(invoice=Ref(Invoice, invoice.id), note="b"))
        other = sa_jobs.insert(session, RemindOnce(invoice=Ref(Invoice, invoice.id + 1)))
    assert not first.unique_skipped_as_duplicate
    assert again.unique_skipped_as_duplicate and again.job.id == first.job.id
    assert not other.unique_skipped_as_duplicate


@attrs.frozen
class Party:
    customer: Ref[Customer]
    invoice: Ref[Invoice] | None = sa_jobs.field(default=None, on_missing="run")  # noqa: RUF009


@sa_jobs.job_args(kind="refs_nested")
class Nested:
    parties: list[Party] = sa_jobs.field(on_missing="discard")


def test_refs_in_nested_classes_are_checked_with_their_fields_setting(
    engine: Engine, app_tables: None
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        customer = Customer(name="here")
        session.add(customer)
    ran: list[object] = []
    ok, gone = enqueue_for(
        engine,
        # The invoice is missing, but its own field says run.
        Nested(parties=[Party(customer=Ref.to(customer), invoice=Ref(Invoice, 1))]),
        # The customer is missing: the outer field's "discard" applies.
        Nested(parties=[Party(customer=Ref(Customer, uuid.UUID(int=5)))]),
    )
    worker = make_worker(engine)

    @worker.handler(Nested)
    def handle(job: Job[Nested], session: Session) -> None:
        ran.append(job.id)

    worker.run_until_idle()
    assert ran == [ok]
    assert job_row(engine, ok).state == sa_jobs.JobState.COMPLETED
    discarded = job_row(engine, gone)
    assert discarded.state == sa_jobs.JobState.DISCARDED
    assert "Customer UUID('00000000-0000-0000-0000-000000000005')" in discarded.errors[0]["error"]
