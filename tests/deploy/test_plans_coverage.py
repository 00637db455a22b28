"""Every operation kind has its plan tested daemon-less: each Spec keelway/deploy
declares names a plan function that some tests/deploy/test_plans_*.py calls, and every
OpKind has a Spec. A new kind fails here until its plan has tests of its own."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import keelway.deploy
from keelway.deploy.operation import Spec
from keelway.journal import OpKind

TESTS = Path(__file__).resolve().parent


def _specs() -> list[Spec]:  # type: ignore[type-arg]
    found = []
    for module in pkgutil.iter_modules(keelway.deploy.__path__):
        loaded = importlib.import_module(f"keelway.deploy.{module.name}")
        for value in vars(loaded).values():
            values = value.values() if isinstance(value, dict) else [value]
            found += [v for v in values if isinstance(v, Spec)]
    return found


def test_every_operation_kind_has_a_spec() -> None:
    assert {spec.kind for spec in _specs()} == set(OpKind)


def test_every_specs_plan_function_is_called_by_a_plan_test() -> None:
    tests = "\n".join(path.read_text() for path in TESTS.glob("test_plans_*.py")
                      if path.name != Path(__file__).name)
    untested = sorted({f"{spec.kind.value}: {spec.plan.__name__}" for spec in _specs()
                       if f"{spec.plan.__name__}(" not in tests})
    assert untested == []
