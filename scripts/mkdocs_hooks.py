"""MkDocs hooks for the documentation site (``mkdocs.yml``, ``hooks:``).

The docstrings are Google style with Sphinx cross-reference roles (``:class:`Job```,
``:func:`~sa_jobs._declare.args.kind_of```), which mkdocstrings renders as the role's name followed
by the code. Strip the role, and for ``~`` keep the last dotted part, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_shown, html)
