"""Pages as HTML: the Jinja environment (autoescaping everything), its filters, and the
response every page gets (security headers, the CSRF cookie, links under the right prefix).

Everything a job carries — args, errors, tracebacks, metadata, kinds, queue names — is
text from whoever enqueued it, so it is only ever written through Jinja's autoescape;
no template marks anything ``|safe``.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from sa_jobs._base.states import JobState
from sa_jobs.dashboard.charts import format_seconds
from sa_jobs.dashboard.database import REPLICA_STATUS
from sa_jobs.dashboard.job_list import parse_instant
from sa_jobs.dashboard.security import (
    CSRF_FIELD,
    SECURITY_HEADERS,
    csrf_token,
    set_csrf_cookie,
)

__all__ = ["NOTICES", "Renderer", "jobs_count"]

#: What a redirect after an action may say (``?notice=retried``); fixed texts, so a link
#: cannot put words in the dashboard's mouth.
NOTICES = {
    "retried": "Retried: the job is available and will run at the next fetch.",
    "cancelled": "Cancelled.",
    "cancel-requested": (
        "Cancel requested: the job is running, and its worker is asked to stop it "
        "(it ends cancelled, unless it completes first)."
    ),
    "already-finished": "The job had already finished: nothing was cancelled.",
    "deleted": "Deleted.",
    "resumed": "The sequence's halted job was retried: the sequence runs on from it.",
    "paused": "Queue paused: workers stop fetching from it; running jobs finish.",
    "unpaused": "Queue resumed.",
    "ran": (
        "Run requested: the next tick of a worker that has this periodic job inserts "
        "its job (within a second or so)."
    ),
    "bulk-retried": "Retried {n}.",
    "bulk-cancelled": "Cancelled {n} (running ones were asked to stop).",
    "bulk-deleted": "Deleted {n} (running jobs are never deleted).",
    "workflow-cancelled": (
        "Workflow cancelled: {n} (its unfinished steps and callbacks; running steps were "
        "asked to stop)."
    ),
}

STATE_ORDER = [state.value for state in JobState]


@attrs.frozen
class Page:
    """What every template sees beside its own values."""

    request: Request
    prefix: str
    read_only: bool
    csrf: str

    def url(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        """A link to the dashboard's ``path``, under its prefix, with ``params``."""
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v != ""})
        return f"{self.prefix}{path}" + (f"?{query}" if query else "")

    def here(self, **changes: Any) -> str:
        """This page's link, with some query parameters changed ("" drops one)."""
        root = self.request.scope.get("root_path", "")
        path = self.request.url.path.removeprefix(root) or "/"
        return self.url(path, {**self.request.query_params, **changes})


def _instant(value: dt.datetime | str | None) -> dt.datetime | str | None:
    """A time as stored: a datetime, or the ISO text of an error record's ``at`` (parsed
    when it is one; other text is shown as it is)."""
    if isinstance(value, str):
        return parse_instant(value) or value
    return value


def _ago(value: dt.datetime | str | None, now: dt.datetime | None = None) -> str:
    value = _instant(value)
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    now = now or dt.datetime.now(dt.UTC)
    seconds = (now - value).total_seconds()
    if seconds < 0:
        return "in " + format_seconds(-seconds)
    return format_seconds(seconds) + " ago"


def _since(value: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """How long since ``value`` (``12.0 s``): a run's length so far."""
    if value is None:
        return "-"
    now = now or dt.datetime.now(dt.UTC)
    # Another host's clock may be a little ahead of this one.
    return format_seconds(max((now - value).total_seconds(), 0.0))


def _timestamp(value: dt.datetime | str | None) -> str:
    value = _instant(value)
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(value: dt.timedelta | None) -> str:
    return "-" if value is None else format_seconds(value.total_seconds())


def _count(value: int | float) -> str:
    return f"{round(value):,}"


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _hex(value: bytes | memoryview | None) -> str:
    return "-" if value is None else bytes(value).hex()


#: ``?refresh=N`` reloads the page every N seconds (a meta refresh: no script needed).
REFRESH_CHOICES = (5, 15, 60)


def _refresh(request: Request) -> int | None:
    text = request.query_params.get("refresh", "")
    return int(text) if text.isdigit() and int(text) in REFRESH_CHOICES else None


def _notice(request: Request) -> str | None:
    """The fixed text ``?notice=`` names; ``{n}`` in it becomes ``?n=`` jobs (digits only)."""
    text = NOTICES.get(request.query_params.get("notice", ""))
    count = request.query_params.get("n", "")
    if text is None or "{n}" not in text:
        return text
    return text.replace("{n}", jobs_count(int(count)) if count.isdigit() else "the jobs")


def jobs_count(count: int) -> str:
    """``1 job``, ``1,000 jobs``."""
    return f"{count:,} job" + ("" if count == 1 else "s")


class Renderer:
    def __init__(self, *, base_path: str, read_only: bool) -> None:
        self.base_path = base_path
        self.read_only = read_only
        self.environment = jinja2.Environment(
            loader=jinja2.PackageLoader("sa_jobs.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.environment.filters.update(
            ago=_ago,
            since=_since,
            timestamp=_timestamp,
            pretty_json=_pretty_json,
            hex=_hex,
            seconds=format_seconds,
            duration=_duration,
            count=_count,
        )
        self.environment.globals.update(
            states=STATE_ORDER, csrf_field=CSRF_FIELD, refresh_choices=REFRESH_CHOICES
        )

    def prefix(self, request: Request) -> str:
        """Where the dashboard is, seen from the browser: the proxy's prefix
        (``base_path``), then the path it is mounted at (the ASGI ``root_path``)."""
        root: str = request.scope.get("root_path", "")
        return self.base_path + root

    def page(
        self, request: Request, template: str, status_code: int = 200, **values: Any
    ) -> HTMLResponse:
        token, new = csrf_token(request)
        prefix = self.prefix(request)
        page = Page(request=request, prefix=prefix, read_only=self.read_only, csrf=token)
        notice = _notice(request)
        html = self.environment.get_template(template).render(
            page=page,
            notice=notice,
            refresh=_refresh(request),
            replica=REPLICA_STATUS.get(),
            **values,
        )
        response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
        if new:
            set_csrf_cookie(response, request, token, prefix or "/")
        return response
