"""The documented import paths keep working: what the docs, the README and the examples
tell an application to import, and the names ``sa_jobs`` exports.

Internal modules live in private packages (``sa_jobs._base``, ``sa_jobs._insert``, ...:
docs/architecture.md) and may move; these paths may not without a breaking release.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import sa_jobs

REPO = Path(__file__).resolve().parents[2]

#: ``sa_jobs.__all__`` as released (with this round's workflow and result names): moving
#: modules must not change it.
EXPORTED = [
    "AddedStep",
    "ArgsConverter",
    "Batch",
    "BulkResult",
    "ConcurrencyLimit",
    "ExponentialRetry",
    "FailedStep",
    "Health",
    "HealthThresholds",
    "InsertAction",
    "InsertHook",
    "InsertManyParams",
    "InsertOptions",
    "InsertOpts",
    "InsertResult",
    "InsertedWorkflow",
    "Job",
    "JobKeyMode",
    "JobState",
    "KindRegistry",
    "MaintenanceConfig",
    "PeriodicJob",
    "Queue",
    "QueueState",
    "RateLimit",
    "Ref",
    "RemoveOutcome",
    "Retention",
    "RetryPolicy",
    "SaJobsError",
    "SequenceOpts",
    "Stats",
    "Step",
    "UniqueOpts",
    "WorkHook",
    "Worker",
    "Workflow",
    "WorkflowStatus",
    "add_insert_hook",
    "add_to_workflow",
    "cancel_job",
    "cancel_jobs",
    "cancel_workflow",
    "chain",
    "check_health",
    "chord",
    "complete_in",
    "delete_jobs",
    "downgrade",
    "enqueue",
    "errors",
    "field",
    "group",
    "hooks",
    "insert",
    "insert_job",
    "insert_many",
    "insert_many_fast",
    "insert_workflow",
    "job_args",
    "jobs_for",
    "metadata",
    "migrate",
    "pause_queue",
    "queue_states",
    "remove_insert_hook",
    "remove_job",
    "resume_queue",
    "retry_job",
    "retry_jobs",
    "stats",
    "wait_for",
    "wait_for_all",
    "workflow_status",
]

#: Each documented import path and the names the docs import from it.
DOCUMENTED: dict[str, list[str]] = {
    "sa_jobs.errors": ["SaJobsError", "SchemaMissingError", "InvalidOptionsError"],
    "sa_jobs.hooks": ["AttemptResult", "InsertHook", "InsertingJob", "WorkHook"],
    "sa_jobs.devdb": ["find_server", "throwaway_database"],
    "sa_jobs.dashboard": ["create_app", "basic_auth", "Auth"],
    "sa_jobs.testing": ["run_jobs", "assert_enqueued", "assert_not_enqueued"],
    "sa_jobs.testing.plugin": [],
    "sa_jobs.otel": ["OpenTelemetryHooks"],
    "sa_jobs.prometheus": ["PrometheusMetrics"],
    "sa_jobs.alembic_env": [],
    "sa_jobs.periodic": ["PeriodicJob", "run_now", "periodic_jobs"],
    "sa_jobs.worker": ["Worker"],
    "sa_jobs.cli": ["main"],
    "sa_jobs.benchmark": [],
}

USER_TEXTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "examples").rglob("*.py")),
]


def test_sa_jobs_exports_what_it_exported() -> None:
    assert sa_jobs.__all__ == EXPORTED
    for name in EXPORTED:
        assert getattr(sa_jobs, name) is not None


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_each_documented_module_imports_with_its_names(module: str) -> None:
    imported = importlib.import_module(module)
    for name in DOCUMENTED[module]:
        assert hasattr(imported, name), f"{module}.{name}"


def test_the_migration_scripts_are_where_version_locations_points() -> None:
    # docs/migrations.md: version_locations = ... sa_jobs:migrations/versions
    scripts = resources.files("sa_jobs").joinpath("migrations/versions")
    assert any(entry.name.endswith(".py") for entry in scripts.iterdir())


def test_the_entry_points_resolve() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    targets = [*project["scripts"].values(), *project["entry-points"]["pytest11"].values()]
    for target in targets:
        module, _, attribute = target.partition(":")
        loaded: Any = importlib.import_module(module)
        if attribute:
            assert callable(getattr(loaded, attribute)), target


def _code_imports(text: str) -> list[str]:
    """The ``sa_jobs`` modules a README, docs page or example imports in its code."""
    found = re.findall(r"^\s*from (sa_jobs(?:\.\w+)*) import", text, flags=re.MULTILINE)
    found += re.findall(r"^\s*import (sa_jobs(?:\.\w+)*)", text, flags=re.MULTILINE)
    return found


def test_user_docs_and_examples_import_only_documented_paths() -> None:
    wrong = []
    for path in USER_TEXTS:
        for module in _code_imports(path.read_text()):
            if module != "sa_jobs" and module not in DOCUMENTED:
                wrong.append(f"{path.relative_to(REPO)}: {module}")
    assert wrong == [], "an import path the docs show but this test does not protect"


#: Dotted names in the docs that are not Python paths: OpenTelemetry span attributes.
NOT_PATHS = ("sa_jobs.job.", "sa_jobs.attempt.")


def test_every_dotted_sa_jobs_name_in_the_user_docs_resolves() -> None:
    # `sa_jobs.x.y` in prose: a module, or a name of one. A stale path fails here.
    unresolved = []
    for path in USER_TEXTS:
        for dotted in set(re.findall(r"`~?(sa_jobs(?:\.\w+)+)", path.read_text())):
            if not dotted.startswith(NOT_PATHS) and not _resolves(dotted):
                unresolved.append(f"{path.relative_to(REPO)}: {dotted}")
    assert unresolved == []


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_the_examples_import_nothing_private() -> None:
    # The examples are code users copy: they use the public names only.
    for path in sorted((REPO / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert "._" not in node.module, f"{path.relative_to(REPO)}: {node.module}"
