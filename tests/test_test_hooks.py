"""No test hook in production code: what keelway ships imports nothing of
keelway/testing and reads no variable that only tests set. A fake (of time, of danger)
reaches production code by injection, as an argument, never by a lookup of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keelway"
_TEST_VARIABLE = re.compile(r"KEELWAY_TEST")
# None left: a window a test must hold open across processes is a pause point
# (keelway/failpoints.py pause), armed as crash points are.
KNOWN: set[str] = set()


def _production_modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] != "testing"]


def test_no_production_module_imports_keelway_testing() -> None:
    wrong = []
    for path in _production_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.relative_to(PACKAGE)} imports {name}" for name in names
                      if name == "keelway.testing" or name.startswith("keelway.testing.")]
    assert wrong == []


def test_no_production_module_reads_a_variable_only_tests_set() -> None:
    found = set()
    for path in _production_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and _TEST_VARIABLE.match(node.value)):
                found.add(f"{path.relative_to(PACKAGE)} reads {node.value.split('=')[0]}")
    assert found == KNOWN
