"""What every request handler of the dashboard shares: the :class:`Dashboard` of its app."""

from __future__ import annotations

import attrs
from starlette.requests import Request
from starlette.responses import Response

from sa_jobs.dashboard.database import Database
from sa_jobs.dashboard.rendering import Renderer

__all__ = ["Dashboard"]


@attrs.frozen
class Dashboard:
    """One dashboard app's settings and helpers (kept on ``app.state.dashboard``)."""

    database: Database
    renderer: Renderer
    read_only: bool

    @classmethod
    def of(cls, request: Request) -> Dashboard:
        # scope["app"] is the innermost Starlette app: the dashboard, even when mounted.
        dashboard: Dashboard = request.app.state.dashboard
        return dashboard

    def error_page(self, request: Request, status: int, message: str) -> Response:
        return self.renderer.page(
            request, "error.html", status_code=status, status=status, message=message
        )
