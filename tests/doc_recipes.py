"""Code blocks of ``docs/`` run as modules, so a recipe in the docs is the one the tests run.

A recipe is the first ``python`` block after a heading; it is executed as a module of its
own (registered in ``sys.modules``, as libraries such as pydantic expect of a class's
module), once per process.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def recipe_source(document: str, heading: str) -> str:
    """The first ``python`` code block after ``## heading`` in ``docs/<document>``."""
    text = (DOCS / document).read_text()
    start = text.find(f"\n## {heading}\n")
    assert start >= 0, f"docs/{document} has no section {heading!r}"
    match = re.compile(r"```python\n(.*?)```", re.DOTALL).search(text, start)
    assert match is not None, f"section {heading!r} of docs/{document} has no python block"
    return match.group(1)


def load_recipe(document: str, heading: str) -> types.ModuleType:
    """Run the recipe as a module named after the section; return the module."""
    slug = re.sub(r"\W+", "_", f"{document}_{heading}").strip("_").lower()
    name = f"tests.doc_recipes.{slug}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = str(DOCS / document)
    sys.modules[name] = module
    try:
        code = compile(recipe_source(document, heading), str(DOCS / document), "exec")
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
