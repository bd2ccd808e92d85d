"""``sa-jobs work MODULE:ATTRIBUTE``: run an application's worker until a signal."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from sa_jobs.cli.common import CommandError
from sa_jobs.worker import Worker

__all__ = ["add_command", "load_worker"]

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "work",
        help="run a worker until SIGTERM/SIGINT",
        description="Import MODULE (the current directory is on the path), take ATTRIBUTE — "
        "a sa_jobs.Worker, or a function of no arguments returning one — and run it until "
        "SIGTERM or SIGINT. A first signal lets running jobs finish; a second cancels them.",
    )
    parser.add_argument("app", metavar="MODULE:ATTRIBUTE", help="e.g. myapp.jobs:worker")
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="logging level (default INFO)",
    )
    parser.set_defaults(run=_work)


def _work(options: argparse.Namespace) -> int:
    logging.basicConfig(level=options.log_level, format=LOG_FORMAT)
    worker = load_worker(options.app)
    worker.run()
    return 0


def load_worker(spec: str) -> Worker:
    """Import ``MODULE:ATTRIBUTE`` and return the :class:`sa_jobs.Worker` it names.

    ``ATTRIBUTE`` may be dotted (``module:app.worker``) and may name a function of no
    arguments that returns the worker. The current directory goes first on
    ``sys.path``, as ``uvicorn`` and ``celery`` do, so ``sa-jobs work app:worker`` finds
    ``./app.py``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{spec!r} is not MODULE:ATTRIBUTE, e.g. myapp.jobs:worker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing *named* module is the user's typo; a missing import inside it
        # is a bug in their code and keeps its traceback.
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise
        raise CommandError(f"cannot import module {module_name!r}: {exc}") from None
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Worker) and callable(target):
        target = target()
    if not isinstance(target, Worker):
        raise CommandError(
            f"{spec} is a {type(target).__name__}, not a sa_jobs.Worker "
            "(or a function of no arguments returning one)"
        )
    return target


def _is_prefix(name: str, module_name: str) -> bool:
    return module_name == name or module_name.startswith(name + ".")
