"""References to ORM rows, checked by ``mypy --strict`` in ``tests/unit/test_typing.py``:
``job.args.invoice.load(session)`` is an ``Invoice``."""

from __future__ import annotations

from typing import reveal_type

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "typing_invoice"
    id: Mapped[int] = mapped_column(primary_key=True)


@sa_jobs.job_args(kind="typing_send_invoice")
class SendInvoice:
    invoice: sa_jobs.Ref[Invoice] = sa_jobs.field(sequence=True)
    reminder: bool = False


def enqueue(session: Session, invoice: Invoice) -> None:
    session.add(sa_jobs.enqueue(SendInvoice(invoice=sa_jobs.Ref.to(invoice))))
    session.add(sa_jobs.enqueue(SendInvoice(invoice=sa_jobs.Ref(Invoice, 7))))
    reveal_type(sa_jobs.jobs_for(session, invoice))


def handle(job: sa_jobs.Job[SendInvoice], session: Session) -> None:
    reveal_type(job.args.invoice.load(session, for_update=True))
    reveal_type(job.args.invoice.get(session))


async def handle_async(job: sa_jobs.Job[SendInvoice], session: AsyncSession) -> None:
    reveal_type(await job.args.invoice.load(session))
