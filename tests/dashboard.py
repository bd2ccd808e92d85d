"""What the dashboard's tests share: a test client that posts the dashboard's own forms,
and a real uvicorn server on a free port (for the browser)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import uvicorn

with warnings.catch_warnings():
    # Starlette's test client warns that it will move to httpx2; httpx is what we have.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sa_jobs.dashboard.security import CSRF_COOKIE, CSRF_FIELD, SECURE_CSRF_COOKIE

__all__ = ["DashboardClient", "forms_posting", "free_port", "serving"]


class DashboardClient(TestClient):
    """A test client that posts like the dashboard's forms: with the CSRF cookie's token."""

    def token(self) -> str:
        name = SECURE_CSRF_COOKIE if self.base_url.scheme == "https" else CSRF_COOKIE
        if name not in self.cookies:
            self.get("/")
        return str(self.cookies[name])

    def act(self, path: str, **fields: Any) -> Any:
        data = {CSRF_FIELD: self.token(), **fields}
        return self.post(path, data=data, follow_redirects=False)


def forms_posting(html: str) -> list[str]:
    """The actions of the page's POST forms."""
    return re.findall(r'<form method="post" action="([^"]*)"', html)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="dashboard-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the dashboard's uvicorn server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


#: Debian's package; Playwright drives it instead of a browser build of its own.
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
REQUIRE_VARIABLE = "SA_JOBS_REQUIRE_CHROMIUM"


def chromium() -> str:
    """The chromium binary; skips the test without it — fails when
    ``SA_JOBS_REQUIRE_CHROMIUM=1`` (set by ``.ci/run``, which installs it): CI must run
    the browser tests."""
    import os
    import shutil

    import pytest

    for path in (*CHROMIUM_PATHS, shutil.which("chromium") or ""):
        if path and os.access(path, os.X_OK):
            return path
    message = "chromium is not installed (apt-get install chromium)"
    if os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0"):
        pytest.fail(f"{message}, and ${REQUIRE_VARIABLE} requires it")
    pytest.skip(message)
