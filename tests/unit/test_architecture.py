"""The layout explains itself: no import cycles, and docs/architecture.md maps every module.

Both are read with the standard library's ``ast``, without importing anything: an import
inside a function counts like any other, so a cycle cannot hide behind a late import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sa_jobs"
SCRIPTS = PACKAGE / "migrations" / "versions"


def modules() -> dict[str, Path]:
    """Module name → file, for every module of the package but the migration scripts."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(SCRIPTS):
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:``: imports for annotations, never run."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for statement in node.body:
                found.update(ast.walk(statement))
    return found


def imported(
    name: str, path: Path, known: dict[str, Path], *, at_run_time: bool = False
) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body.

    With ``at_run_time``, imports under ``if TYPE_CHECKING:`` are left out: they name a
    type in an annotation and never load the module.
    """
    targets: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree) if at_run_time else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        targets |= {c for c in candidates if c in known and c != name}
    # A submodule importing its own package's __init__ is Python's business, not a cycle.
    return {t for t in targets if not name.startswith(t + ".") and t != "sa_jobs"}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_imports_one_that_imports_it_back() -> None:
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    # The check above must not pass vacuously.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from sa_jobs._table import models\n")
    assert imported("sa_jobs.late", source, {"sa_jobs._table.models": source}) == {
        "sa_jobs._table.models"
    }


def test_the_architecture_page_maps_every_module_and_only_those() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    mapped = set(re.findall(r"^\| `(sa_jobs/[\w/]+\.py)` \|", page, flags=re.MULTILINE))
    existing = {str(path.relative_to(REPO)) for path in modules().values()}
    assert sorted(existing - mapped) == [], "modules missing from docs/architecture.md"
    assert sorted(mapped - existing) == [], "docs/architecture.md names modules that do not exist"


#: The private packages, by layer, in the order of docs/architecture.md: a module may
#: import (at run time) from its own layer and the ones before it, never from a later one.
#: ``sa_jobs.errors`` is a leaf; ``sa_jobs.hooks`` (public) sits between the table and
#: inserting: the insert path calls it, and it knows rows and outcomes only as records.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sa_jobs._base", "sa_jobs.errors"),
    ("sa_jobs._declare",),
    ("sa_jobs._table",),
    ("sa_jobs.hooks",),
    ("sa_jobs._insert",),
    ("sa_jobs._act",),
    ("sa_jobs._inspect",),
)

#: The documented import paths: what an application may import. Every other module
#: is in a private package (a leading underscore) or inside one of these packages.
PUBLIC_TOP_LEVEL = {
    "sa_jobs",
    "sa_jobs.alembic_env",
    "sa_jobs.benchmark",
    "sa_jobs.cli",
    "sa_jobs.dashboard",
    "sa_jobs.devdb",
    "sa_jobs.errors",
    "sa_jobs.hooks",
    "sa_jobs.migrations",
    "sa_jobs.otel",
    "sa_jobs.periodic",
    "sa_jobs.prometheus",
    "sa_jobs.testing",
    "sa_jobs.worker",
}


def _layer(name: str) -> int | None:
    for index, members in enumerate(LAYERS):
        if any(name == member or name.startswith(member + ".") for member in members):
            return index
    return None


def test_every_top_level_module_is_public_or_in_a_private_package() -> None:
    top = {".".join(name.split(".")[:2]) for name in modules()}
    private = {name for name in top if name.split(".")[-1].startswith("_")}
    assert sorted(top - private - PUBLIC_TOP_LEVEL) == [], "a new top-level module: public?"
    assert sorted(private) == sorted(
        member for layer in LAYERS for member in layer if member.split(".")[-1].startswith("_")
    )


def test_no_layer_imports_a_later_one() -> None:
    known = modules()
    wrong = []
    for name, path in sorted(known.items()):
        own = _layer(name)
        if own is None:
            continue
        for target in sorted(imported(name, path, known, at_run_time=True)):
            theirs = _layer(target)
            if theirs is None or theirs > own:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_hooks_and_the_integrations_know_rows_and_outcomes_only_as_records() -> None:
    # JobRow, the outcome types and InsertResult live in sa_jobs._base.records, so what
    # observes inserts and attempts never loads the code that makes them. Prometheus
    # reads the queue controls' tables (paused, unserved) through sa_jobs._act.queues.
    known = modules()
    for name in ("sa_jobs.hooks", "sa_jobs.otel", "sa_jobs.prometheus"):
        found = imported(name, known[name], known)
        assert sorted(t for t in found if t.startswith("sa_jobs._insert")) == [], name
        assert sorted(t for t in found if t.startswith("sa_jobs._act.complete")) == [], name
