"""The sa_jobs dashboard: an ASGI app that shows the queue and acts on it.

``create_app(engine, auth=..., read_only=..., base_path=...)`` returns a Starlette
application to mount in your own (FastAPI, Starlette, any ASGI server), and
``sa-jobs dashboard`` serves one on its own. Needs the ``dashboard`` extra
(``pip install 'sa-jobs[dashboard]'``). See docs/dashboard.md.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"sa_jobs.dashboard needs the 'dashboard' extra ({exc.name} is missing): "
        "pip install 'sa-jobs[dashboard]'"
    ) from exc

from sa_jobs.dashboard.app import create_app
from sa_jobs.dashboard.security import Auth, basic_auth

__all__ = ["Auth", "basic_auth", "create_app"]
