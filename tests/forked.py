"""A command line run in a forked child of the test process: a process of its own (its
own exit code, stdout, stderr, logging and cwd, nothing it does leaks back), without the
second or two a fresh interpreter spends importing SQLAlchemy, Alembic and sa_jobs again.

For commands whose subject is what they print and do (``alembic upgrade heads``), not the
interpreter start-up; a test about an installed package or a console script keeps
``subprocess`` (``tests/migration/test_migrations.py`` runs the wheel's).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.context
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from alembic.config import Config, main


def _reset_like_a_fresh_interpreter() -> None:
    """Undo what pytest set up in this process, where a fresh interpreter differs: no
    handlers on the root logger (so the command's ``logging.basicConfig`` applies), and
    Python's default warning filters instead of the suite's ``error::SAWarning``."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)


def run_forked(
    main: Callable[[list[str]], object],
    prog: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> CompletedProcess[str]:
    """``main(argv)`` (a command line's entry point, as ``prog`` would call it) in a
    forked child, in ``cwd`` (and ``env``, if given); its exit code (``SystemExit``'s; 1
    for an exception, printed to stderr as an interpreter prints it) and its output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                # The parent's pooled connections are inherited: never touch them (no
                # collector finalising one, no atexit closing them).
                gc.disable()
                os.chdir(cwd)
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                _reset_like_a_fresh_interpreter()
                sys.argv = [prog, *argv]
                try:
                    main(list(argv))
                    code = 0
                except SystemExit as exit_:
                    status = exit_.code
                    code = status if isinstance(status, int) else (0 if status is None else 1)
                    if isinstance(status, str):
                        print(status, file=sys.stderr)
                except BaseException:
                    traceback.print_exc()
                    code = 1
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code & 0xFF)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return CompletedProcess(
            [prog, *argv],
            os.waitstatus_to_exitcode(status),
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def alembic_main(argv: list[str]) -> None:
    """``alembic ARGV`` (the console script's entry point), for :func:`run_forked`.
    Alembic's ``Config`` prints to the ``sys.stdout`` of the time it was imported
    (pytest's capture, in a child of pytest): give it the child's, as a fresh
    interpreter's would be."""
    init = Config.__init__

    def init_printing_to_stdout(self: Config, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stdout", sys.stdout)
        init(self, *args, **kwargs)

    Config.__init__ = init_printing_to_stdout  # type: ignore[method-assign]
    main(argv=argv, prog="alembic")


#: What the fork server imports once, before it forks any process: sa_jobs (SQLAlchemy,
#: Alembic), the shared test modules, and the test modules whose functions its processes
#: run, by the names pytest imported them under (their directories have no
#: ``__init__.py``: ``test_workflow``, not ``tests.integration.test_workflow``, else
#: their args classes would be declared twice).
PRELOAD = [
    "sa_jobs",
    "tests.helpers",
    "test_workflow",
    "test_workflow_callbacks",
    "test_migrations",
]


def process_context() -> multiprocessing.context.BaseContext:
    """A multiprocessing context for tests whose point is separate processes (a race, a
    deploy's migrators): each process is forked from a server that imported
    :data:`PRELOAD` once, where ``spawn`` imported it all again in every process (a
    second or two each; 10 processes per test). Never forked from pytest itself, so no
    thread, connection or lock of the test process is inherited."""
    context = multiprocessing.get_context("forkserver")
    # Only read when the server starts (once per run): the list names every user.
    context.set_forkserver_preload(PRELOAD)
    return context
