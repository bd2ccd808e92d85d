"""The jobs list's filters: parsed from a query string, written back into links, and
turned into WHERE conditions (:mod:`.job_list` reads a page with them; the confirmed
actions act on what they select)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
from sqlalchemy import Text
from sqlalchemy import cast as sql_cast
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.states import JobState
from sa_jobs._inspect.ref_jobs import references_row
from sa_jobs._table.models import state_is

__all__ = ["FilterError", "ListFilter", "parse_ref"]


class FilterError(ValueError):
    """A filter in the query string that cannot be applied (shown on the page as is)."""


@attrs.frozen
class ListFilter:
    """The jobs list's filters; empty strings mean "any"."""

    state: JobState | None = None
    queue: str = ""
    kind: str = ""
    tag: str = ""
    text: str = ""
    #: A partition key (``sa_job.partition_key``, the sa_jobs_fairness branch).
    key: str = ""
    #: A referenced row (``sa_jobs.Ref``), as ``table:[pk]`` (``invoice:[7]``).
    ref: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> ListFilter:
        """The filter in a query string.

        Raises:
            FilterError: an unknown state.
        """
        state_name = params.get("state", "").strip()
        state = None
        if state_name:
            try:
                state = JobState(state_name)
            except ValueError:
                names = ", ".join(s.value for s in JobState)
                raise FilterError(f"unknown state {state_name!r}; use one of {names}") from None
        return cls(
            state=state,
            queue=params.get("queue", "").strip(),
            kind=params.get("kind", "").strip(),
            tag=params.get("tag", "").strip(),
            text=params.get("q", "").strip(),
            key=params.get("key", "").strip(),
            ref=_checked_ref(params.get("ref", "").strip()),
        )

    @property
    def active(self) -> bool:
        return bool(
            self.state or self.queue or self.kind or self.tag or self.text or self.key or self.ref
        )

    def params(self) -> dict[str, str]:
        """The filter as query-string parameters (empty ones left out)."""
        found = {
            "state": self.state.value if self.state else "",
            "queue": self.queue,
            "kind": self.kind,
            "tag": self.tag,
            "q": self.text,
            "key": self.key,
            "ref": self.ref,
        }
        return {name: value for name, value in found.items() if value}

    def params_with(self, **changes: str) -> dict[str, str]:
        """The query string of this filter with some values changed ("" drops one)."""
        return {name: value for name, value in {**self.params(), **changes}.items() if value}

    def conditions(self, jobs: Any) -> list[ColumnElement[bool]]:
        """The WHERE conditions on ``jobs`` (the table or a subquery of it)."""
        found: list[ColumnElement[bool]] = []
        if self.state is not None:
            found.append(state_is(jobs.c.state, self.state))
        if self.queue:
            found.append(jobs.c.queue == self.queue)
        if self.kind:
            found.append(jobs.c.kind == self.kind)
        if self.tag:
            found.append(jobs.c.tags.contains([self.tag]))
        if self.text:
            pattern = "%" + _escape_like(self.text) + "%"
            found.append(sql_cast(jobs.c.args, Text).ilike(pattern, escape="\\"))
        if self.key:
            found.append(jobs.c.partition_key == self.key)
        if self.ref:
            table, pk = parse_ref(self.ref)
            # Among the scanned rows (like the other filters); jobs_for reads the index.
            found.extend(references_row(jobs.c.args, table, pk, None))
        return found


def parse_ref(ref: str) -> tuple[str, list[Any]]:
    """``invoice:[7]`` as ``("invoice", [7])``.

    Raises:
        FilterError: not a table name, a colon and a JSON array.
    """
    table, _, pk_text = ref.rpartition(":[")
    try:
        pk = json.loads("[" + pk_text)
    except ValueError:
        pk = None
    if not table or not isinstance(pk, list):
        raise FilterError(
            f"ref={ref!r}: write a referenced row as table:[key], e.g. invoice:[7]"
        ) from None
    return table, pk


def _checked_ref(ref: str) -> str:
    if ref:
        parse_ref(ref)
    return ref


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
