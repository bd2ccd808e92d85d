"""Testing the app the way its users would: httpx against the ASGI app, a real database.

    DATABASE_URL=postgresql://... pytest examples/fastapi_app

(``tests/integration/test_examples.py`` runs this file against a throwaway database.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

import sa_jobs
from examples.fastapi_app.app import create_app
from examples.fastapi_app.models import Base, Signup, engine_from_env
from examples.fastapi_app.worker import OUTBOX, build_worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif("DATABASE_URL" not in os.environ, reason="set DATABASE_URL"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def schema() -> Iterator[None]:
    """sa_jobs' schema and the app's table, set up once (as a deploy step would)."""
    engine = engine_from_env()
    setup = create_engine(engine.url.set(drivername="postgresql+psycopg"))
    sa_jobs.migrate(setup)  # or `sa-jobs migrate`, or your Alembic env
    Base.metadata.create_all(setup)
    yield
    setup.dispose()


@pytest.fixture
async def engine(schema: None) -> AsyncIterator[AsyncEngine]:
    engine = engine_from_env()
    async with engine.begin() as connection:  # each test starts empty
        await connection.execute(Signup.__table__.delete())
        await connection.execute(sa_jobs.Job.__table__.delete())
    yield engine
    await engine.dispose()


@pytest.fixture
async def client(engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        yield client


async def jobs(engine: AsyncEngine) -> int:
    async with AsyncSession(engine) as session:
        return await session.scalar(select(func.count()).select_from(sa_jobs.Job)) or 0


async def test_a_signup_and_its_job_commit_together(
    engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    created = await client.post("/signups", json={"email": "ada@example.com"})
    assert created.status_code == 201
    assert created.json()["job_id"] is not None
    assert await jobs(engine) == 1

    taken = await client.post("/signups", json={"email": "ada@example.com"})
    assert taken.status_code == 409
    assert await jobs(engine) == 1  # the failed request's job rolled back with it


async def test_the_worker_welcomes_the_signup(
    engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    signup = (await client.post("/signups", json={"email": "grace@example.com"})).json()
    OUTBOX.clear()

    await build_worker(engine).run_until_idle_async(timeout=30)

    assert OUTBOX == ["Welcome, grace@example.com!"]
    assert (await client.get(f"/signups/{signup['id']}")).json()["welcomed"] is True


async def test_the_app_can_run_the_worker_in_its_lifespan(engine: AsyncEngine) -> None:
    app = create_app(engine, run_worker=True)
    OUTBOX.clear()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            signup = (await client.post("/signups", json={"email": "alan@example.com"})).json()
            for _ in range(200):
                if (await client.get(f"/signups/{signup['id']}")).json()["welcomed"]:
                    break
                await asyncio.sleep(0.05)
    assert OUTBOX == ["Welcome, alan@example.com!"]
