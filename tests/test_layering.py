"""The layering written at the top of keelway/__init__.py, checked."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keelway"

# Which keelway packages each layer may import (besides itself and the leaf modules).
LEAVES = {"keelway.durable", "keelway.failpoints", "keelway.clock", "keelway.home",
          "keelway.names", "keelway.journal", "keelway.run_wire", "keelway.identity",
          "keelway.app_path", "keelway.pacing", "keelway.cron", "keelway.limits", "keelway",
          "keelway.testing", "keelway.home_checks", "keelway.metrics",
          "keelway.admin_access"}
ALLOWED = {
    "router": set(),
    "store": set(),
    "builds": set(),
    "runtime": {"store", "router"},
    "reconcile": {"store", "runtime"},
    # instance data: object stores, snapshots and their verification
    "data": {"store", "runtime", "builds"},
    "deploy": {"store", "runtime", "builds", "router", "reconcile", "data"},
    "activator": {"store", "runtime", "builds", "router", "deploy", "reconcile", "data"},
    "api": {"store", "runtime", "builds", "router", "deploy", "reconcile", "activator",
            "data"},
    "cli": set(),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("keelway")}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            for name in _imports(path):
                if name in LEAVES or name.startswith("keelway.testing"):
                    continue
                target = name.split(".")[1]
                if target != layer and target not in allowed:
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []


def test_the_leaf_modules_import_nothing_of_keelway() -> None:
    # What lets every layer, the router included, import them. failpoints is the floor
    # beneath them: it imports nothing of keelway, and a leaf may import it (durable's
    # pause point between a write's temp file and its rename), so no cycle can form.
    leaves = [name for name in LEAVES if name.count(".") == 1 and name != "keelway.testing"]
    wrong = {name: _imports(PACKAGE / f"{name.split('.')[1]}.py") - {"keelway.failpoints"}
             for name in leaves}
    assert {name: found for name, found in wrong.items() if found} == {}
    assert _imports(PACKAGE / "failpoints.py") == set()


def test_the_cli_starts_without_aiohttp_uvloop_or_rich() -> None:
    code = (
        "import sys, keelway.cli.main; "
        "print(sorted(m for m in ('aiohttp', 'uvloop', 'rich', 'keelway.store') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


# The deploy path, bottom up: each part imports only parts listed before it, so a deploy
# request runs API → deployer → attempt → plan / steps → store, runtime, router and
# never comes back to a module it has left. A new part takes its place in this list.
DEPLOY_ORDER = ["errors", "outcome", "locks", "cohorts", "rollouts", "plan", "steps", "targets",
                "generation_start", "fences", "publisher", "operation", "freezing", "apps",
                "instances",
                "domains", "attempt",
                "crash_restarts", "replica_keeper", "passes", "wake_gate", "parking",
                "snapshots",
                "restore", "runs", "jobs", "certify", "deploy_plan", "deployer", "seeding",
                "replication", "drill_schedule"]


def test_the_deploy_path_reads_one_way() -> None:
    known = {path.stem for path in (PACKAGE / "deploy").glob("*.py")}
    assert known <= set(DEPLOY_ORDER) | {"__init__"}, (
        f"place {sorted(known - set(DEPLOY_ORDER))} in DEPLOY_ORDER")
    wrong = []
    for rank, part in enumerate(DEPLOY_ORDER):
        path = PACKAGE / "deploy" / f"{part}.py"
        if not path.exists():
            continue
        below = {f"keelway.deploy.{name}" for name in DEPLOY_ORDER[:rank]}
        for name in _deploy_imports(path):
            if name not in below:
                wrong.append(f"deploy/{part}.py imports {name}")
    assert wrong == []


def _deploy_imports(path: Path) -> set[str]:
    """The deploy parts a module imports, `from keelway.deploy import targets` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "keelway.deploy":
            found.update(f"keelway.deploy.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keelway.deploy."):
            found.add(str(node.module))
    return found
