"""One meaning per class name: no two modules of keelway define a class (or a type
alias) of the same name, so a name in a traceback, a review or a grep means one thing."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keelway"

# Names defined twice, each to be given one meaning: none left, and none may come back.
KNOWN: dict[str, set[str]] = {}


def _defined_names() -> dict[str, set[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].add(module)
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)
                  and node.targets[0].id[:1].isupper() and not node.targets[0].id.isupper()
                  and isinstance(node.value, ast.Subscript | ast.BinOp)):
                where[node.targets[0].id].add(module)  # a type alias: `Progress = ...`
    return where


def test_no_two_modules_define_a_class_of_the_same_name() -> None:
    twice = {name: modules for name, modules in _defined_names().items() if len(modules) > 1}
    assert {name: modules for name, modules in twice.items()
            if KNOWN.get(name) != modules} == {}
