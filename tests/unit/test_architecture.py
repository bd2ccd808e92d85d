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


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body."""
    targets: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
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
    source.write_text("def f():\n    from sa_jobs import models\n")
    assert imported("sa_jobs.late", source, {"sa_jobs.models": source}) == {"sa_jobs.models"}


def test_the_architecture_page_maps_every_module_and_only_those() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    mapped = set(re.findall(r"^\| `(sa_jobs/[\w/]+\.py)` \|", page, flags=re.MULTILINE))
    existing = {str(path.relative_to(REPO)) for path in modules().values()}
    assert sorted(existing - mapped) == [], "modules missing from docs/architecture.md"
    assert sorted(mapped - existing) == [], "docs/architecture.md names modules that do not exist"
