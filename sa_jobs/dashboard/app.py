"""``create_app``: the dashboard as one Starlette application (its routes and middleware)."""

from __future__ import annotations

import logging

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sa_jobs._base.replicas import DEFAULT_MAX_LAG, OnLag, ReplicaReads
from sa_jobs.dashboard import actions, confirmed_actions, failures, pages
from sa_jobs.dashboard.context import Dashboard
from sa_jobs.dashboard.database import Database
from sa_jobs.dashboard.rendering import Renderer
from sa_jobs.dashboard.security import Auth, AuthGate
from sa_jobs.errors import InvalidOptionsError

__all__ = ["create_app"]

log = logging.getLogger("sa_jobs.dashboard")


def create_app(
    engine: Engine | AsyncEngine,
    *,
    auth: Auth | None = None,
    read_only: bool = False,
    base_path: str = "",
    read_engine: Engine | AsyncEngine | None = None,
    max_replica_lag: float = DEFAULT_MAX_LAG,
    on_replica_lag: OnLag = "fall_back",
) -> Starlette:
    """The sa_jobs dashboard, an ASGI application.

    Mount it in your own app (``app.mount("/jobs", create_app(engine, auth=...))``), or
    run it on its own with ``sa-jobs dashboard``.

    Args:
        engine: Where the jobs are: a sync ``Engine`` (queries run in a thread pool) or
            an ``AsyncEngine``.
        auth: Called with every request (a Starlette ``Request``); returns a
            ``Response`` to send instead, or a verdict taken as a truth value (truthy:
            in; falsy: 403); may be async. ``sa_jobs.dashboard.basic_auth(user,
            password)`` makes one. None lets everyone in — every page and every action —
            and logs a warning saying so: only for a dashboard nobody else can reach, or
            one your app guards with its own middleware.
        read_only: Hide every action, and refuse them (403).
        base_path: The path prefix browsers reach the dashboard at when a proxy in front
            strips it (``"/ops/jobs"``). Not needed when mounted: the mount's path is
            seen on its own.
        read_engine: A streaming standby of ``engine``'s database (of the same kind,
            sync or async): every page reads there, every action writes through
            ``engine``. Each page says how far behind the replica is. Refused when it
            reaches another database; a warning when it reaches the primary itself.
        max_replica_lag: Seconds the replica may be behind (default 5).
        on_replica_lag: Past it, ``"fall_back"`` (read through ``engine``, the default)
            or ``"report"`` (read the replica anyway; the page says its figures are
            stale).

    Raises:
        InvalidOptionsError: a ``base_path`` that is not ``""`` or ``"/something"``, an
            ``auth`` that is not callable, or not an engine.
    """
    if base_path and (not base_path.startswith("/") or base_path.endswith("/")):
        raise InvalidOptionsError(
            "base_path",
            f"must start with '/' and not end with one (e.g. '/jobs'), got {base_path!r}",
        )
    if auth is not None and not callable(auth):
        raise InvalidOptionsError(
            "auth", "must be a callable taking the request (see sa_jobs.dashboard.basic_auth)"
        )
    if auth is None:
        log.warning(
            "sa_jobs dashboard created with auth=None: every request is let in, actions "
            "included. Pass create_app(engine, auth=...) — a callable on the request, or "
            "sa_jobs.dashboard.basic_auth(user, password) — unless your app guards the "
            "mount itself or only this machine can reach it."
        )
    replica = (
        None
        if read_engine is None
        else ReplicaReads(read_engine, max_lag=max_replica_lag, on_lag=on_replica_lag)
    )
    dashboard = Dashboard(
        database=Database(engine, replica),
        renderer=Renderer(base_path=base_path, read_only=read_only),
        read_only=read_only,
    )
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/jobs/{job_id:int}/retry", actions.retry, methods=["POST"]),
        Route("/jobs/{job_id:int}/cancel", actions.cancel, methods=["POST"]),
        Route("/jobs/{job_id:int}/delete", confirmed_actions.delete, methods=["POST"]),
        Route("/jobs/bulk", confirmed_actions.bulk, methods=["POST"]),
        Route("/workflows", pages.workflows, name="workflows"),
        Route("/workflows/{workflow_id:int}", pages.workflow, name="workflow"),
        Route(
            "/workflows/{workflow_id:int}/cancel",
            confirmed_actions.cancel_workflow,
            methods=["POST"],
        ),
        Route("/sequences", pages.sequences, name="sequences"),
        Route("/sequences/{job_id:int}/resume", actions.resume_sequence, methods=["POST"]),
        Route("/periodic", pages.periodic, name="periodic"),
        Route("/periodic/run", actions.run_periodic_now, methods=["POST"]),
        Route("/workers", pages.workers, name="workers"),
        Route("/queues/pause", actions.pause, methods=["POST"]),
        Route("/queues/resume", actions.unpause, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("sa_jobs.dashboard", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AuthGate, auth=auth)],
        exception_handlers={
            HTTPException: failures.http_error,
            **dict.fromkeys(failures.HANDLED, failures.page_for_error),
        },
    )
    app.state.dashboard = dashboard
    return app
