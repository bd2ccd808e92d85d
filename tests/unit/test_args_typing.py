"""What type checkers make of ``@job_args`` on the classes people write: mypy --strict
over a small user module, expecting exactly the errors marked in it.

``@job_args`` is a ``dataclass_transform`` whose args are frozen unless ``frozen=False``
says otherwise, on top of whatever the class's own decorator says. A mutable dataclass or
attrs class must type-check as mutable when declared with ``frozen=False``, and a frozen
one as frozen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

USER_MODULE = textwrap.dedent(
    """
    from __future__ import annotations

    import dataclasses

    import attrs

    import sa_jobs


    @sa_jobs.job_args(kind="user.draft", frozen=False)
    @dataclasses.dataclass
    class Draft:
        body: str = ""


    @sa_jobs.job_args(kind="user.frozen")
    @dataclasses.dataclass(frozen=True, slots=True)
    class Frozen:
        n: int
        label: str = "x"


    @sa_jobs.job_args(kind="user.plain")
    class Plain:
        n: int


    @sa_jobs.job_args(kind="user.mutable_attrs", frozen=False)
    @attrs.define
    class MutableAttrs:
        n: int


    draft = Draft()
    draft.body = "edited"
    frozen = Frozen(1)
    label: str = frozen.label
    moved: Frozen = dataclasses.replace(frozen, n=2)
    mutable = MutableAttrs(1)
    mutable.n = 2
    frozen.n = 3  # error: read-only
    Plain(1).n = 3  # error: read-only
    Frozen("one")  # error: arg-type
    """
)


def test_mypy_sees_dataclass_and_attrs_args_as_their_authors_declared_them(
    tmp_path: Path,
) -> None:
    module = tmp_path / "user_jobs.py"
    module.write_text(USER_MODULE)
    expected = {
        number
        for number, line in enumerate(USER_MODULE.splitlines(), start=1)
        if "# error:" in line
    }

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(REPO / ".mypy_cache"),
            str(module),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=False,
    )

    reported = {
        int(match.group(1)) for match in re.finditer(r"user_jobs\.py:(\d+): error:", result.stdout)
    }
    assert reported == expected, result.stdout + result.stderr
