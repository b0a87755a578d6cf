"""Layers point down only: pipelines -> components -> ac2_core, and ac2_core/math does no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE = {"ac2_core": {"components", "pipelines"}, "components": {"pipelines"}}
# what ac2_core/math may import: numbers in, numbers out
PURE = {
    "__future__",
    "math",
    "dataclasses",
    "typing",
    "collections",
    "itertools",
    "functools",
    "statistics",
    "operator",
    "torch",
    "numpy",
}


def imported_modules(path: Path) -> set[str]:
    """The absolute module names a module imports, wherever in the module the import stands."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_packages(path: Path) -> set[str]:
    """The top-level packages of ``imported_modules``."""
    return {name.split(".")[0] for name in imported_modules(path)}


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_no_module_imports_a_layer_above_its_own(layer):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & ABOVE[layer]) for path in (ROOT / layer).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_math_package_imports_nothing_that_does_io():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(path)  # ac2_core.math itself, yes; ac2_core.storage, no
            if name.split(".")[0] not in PURE and not name.startswith("ac2_core.math")
        )
        for path in (ROOT / "ac2_core" / "math").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pipelines import cli\n    import components.io\n")
    assert imported_packages(module) == {"pipelines", "components"}
