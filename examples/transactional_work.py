"""Work that commits with its job: effects happen once, though jobs run at least once.

    python examples/transactional_work.py

A handler that declares a ``session`` parameter gets a transaction of its own, and the
worker completes the job inside it. An attempt that fails after writing rolls its writes
back with it, so a retried job never pays an invoice twice. And cancelling a job is a
write like any other: :func:`sa_jobs.cancel_job` runs in the caller's transaction,
together with the change that made the job pointless.

It makes a throwaway database on whatever server ``sa_jobs.devdb`` finds and drops it
at the end. The failed attempt is logged to stderr; stdout is the same on every run.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import Engine, ForeignKey, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int]
    status: Mapped[str] = mapped_column(default="open")


class Payment(Base):
    __tablename__ = "payments"

    id: Mapped[int] = mapped_column(primary_key=True)
    invoice_id: Mapped[int] = mapped_column(ForeignKey("invoices.id"))
    amount: Mapped[int]


@sa_jobs.job_args(kind="charge_invoice", max_attempts=3)
class ChargeInvoice:
    invoice_id: int


class RetryAtOnce:
    """Retry without waiting, so ``run_until_idle`` finishes the retry too."""

    def next_delay(self, job: sa_jobs.Job) -> dt.timedelta:
        return dt.timedelta(0)


def make_worker(engine: Engine) -> sa_jobs.Worker:
    worker = sa_jobs.Worker(engine, queues={"default": 3}, retry_policy=RetryAtOnce())

    @worker.handler(ChargeInvoice)
    def charge_invoice(job: sa_jobs.Job, session: Session) -> None:
        invoice = session.get_one(Invoice, job.args.invoice_id)
        session.add(Payment(invoice_id=invoice.id, amount=invoice.amount))
        invoice.status = "paid"
        session.flush()
        if invoice.id == 2 and job.attempt == 1:
            # The payment row above is rolled back with this attempt.
            raise ConnectionError("the payment gateway timed out")

    return worker


def run(engine: Engine) -> None:
    sa_jobs.migrate(engine)
    Base.metadata.create_all(engine)

    with Session(engine) as session, session.begin():
        session.add_all([Invoice(id=1, amount=100), Invoice(id=2, amount=250)])
        session.add(Invoice(id=3, amount=75))
        jobs = {n: sa_jobs.insert(session, ChargeInvoice(invoice_id=n)).job.id for n in (1, 2, 3)}
    print("3 invoices, each with a charge_invoice job")

    with Session(engine) as session, session.begin():
        session.get_one(Invoice, 3).status = "void"
        cancelled = sa_jobs.cancel_job(session, jobs[3])
        print(f"invoice 3 voided and its job {cancelled.state.value} in one transaction")

    make_worker(engine).run_until_idle()

    with Session(engine) as session:
        for invoice in session.scalars(select(Invoice).order_by(Invoice.id)):
            payments = session.scalars(
                select(Payment.amount).where(Payment.invoice_id == invoice.id)
            ).all()
            print(f"invoice {invoice.id}: {invoice.status}, payments {list(payments)}")
        for job in session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)):
            failures = "; ".join(error["error"] for error in job.errors) or "no failures"
            print(
                f"job #{job.id} invoice {job.args.invoice_id}: {job.state.value}, "
                f"attempt {job.attempt}/{job.max_attempts} ({failures})"
            )


def main() -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    server = find_server()
    print(f"using {server.source}")
    try:
        with throwaway_database(server, prefix="sa_jobs_example") as url:
            engine = create_engine(url)
            try:
                run(engine)
            finally:
                engine.dispose()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
