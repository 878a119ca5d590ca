"""The package's rooms stay small and named (docs/architecture.md): no module over 500 lines, no function
over 60, every module said in the architecture page.

A file or a function that grows past these is carved, not excused: the numbers are the ones the
package was brought under, and a test holds them so that they do not creep back one line at a time.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "src" / "tfdata_operator"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"found only {len(found)} modules under {PACKAGE}"
    return found


def test_no_module_is_over_500_lines() -> None:
    over = {
        str(p.relative_to(PACKAGE)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines (carve them): {over}"


def test_no_function_is_over_60_lines() -> None:
    over = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = lines
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (carve them): {over}"


def test_docs_architecture_names_every_module() -> None:
    """Its tables of what each layer holds name every module of the package (a new one is placed there)."""
    text = (PACKAGE.parents[2] / "docs" / "architecture.md").read_text()
    unnamed = [
        str(p.relative_to(PACKAGE))
        for p in modules()
        if p.stem not in ("__init__", "__main__") and p.parent != PACKAGE and f"`{p.stem}`" not in text
    ]
    assert not unnamed, f"docs/architecture.md does not say what these modules hold: {unnamed}"
