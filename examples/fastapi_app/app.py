"""The web app: an endpoint that writes a row and enqueues a job in one transaction.

    uvicorn examples.fastapi_app.app:app          # DATABASE_URL=postgresql+asyncpg://...

Everything runs on ``AsyncSession`` over asyncpg. The signup row and its welcome-email
job are written by one transaction: if the request fails (a taken email), neither
exists. With ``RUN_WORKER=1`` the app also runs the worker in-process, started and
stopped by the lifespan; in production you would rather run ``worker.py`` as its own
process (``sa-jobs work examples.fastapi_app.worker:worker``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

import sa_jobs
from examples.fastapi_app.models import SendWelcomeEmail, Signup, database_url, engine_from_env
from examples.fastapi_app.worker import build_worker


class SignupIn(BaseModel):
    email: str


class SignupOut(BaseModel):
    id: int
    email: str
    welcomed: bool
    job_id: int | None = None


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    """A request's session, from the app's sessionmaker."""
    async with request.app.state.sessions() as session:
        yield session


Db = Annotated[AsyncSession, Depends(session)]


def create_app(engine: AsyncEngine, *, run_worker: bool = False) -> FastAPI:

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if not run_worker:
            yield
            return
        async with build_worker(engine):  # started here, stopped gracefully on shutdown
            yield

    app = FastAPI(lifespan=lifespan)
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)

    @app.post("/signups", status_code=201)
    async def sign_up(body: SignupIn, session: Db) -> SignupOut:
        try:
            async with session.begin():
                signup = Signup(email=body.email)
                session.add(signup)
                # The job references the pending row: the flush inserts the signup
                # first, then the job with the signup's new id.
                job = sa_jobs.enqueue(SendWelcomeEmail(signup=sa_jobs.Ref.to(signup)))
                session.add(job)
                await session.flush()
        except IntegrityError:
            raise HTTPException(409, f"{body.email} has signed up already") from None
        return SignupOut(id=signup.id, email=signup.email, welcomed=False, job_id=job.id)

    @app.get("/signups/{signup_id}")
    async def get_signup(signup_id: int, session: Db) -> SignupOut:
        signup = await session.scalar(select(Signup).where(Signup.id == signup_id))
        if signup is None:
            raise HTTPException(404, "no such signup")
        return SignupOut(id=signup.id, email=signup.email, welcomed=signup.welcomed)

    return app


def _app_from_env() -> FastAPI | None:
    if database_url() is None:
        return None  # imported by the tests, which build their own
    return create_app(engine_from_env(), run_worker=os.environ.get("RUN_WORKER") == "1")


app = _app_from_env()
