"""Every method of every store protocol has a contract test: a test function of this
suite that calls it (`store.apps.get_app(`, `store.install(`). A method added to a
protocol without one fails here, by name."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from keelway.store.store import NOUNS, Store, protocol_methods

SUITE = Path(__file__).resolve().parent


def required() -> set[str]:
    """`noun.method` for every method of every noun protocol, and each intent of
    `Store` itself (install, park, ..., close), a noun's namesake too: the intent
    `plan_generation` and `generations.plan_generation` write different things."""
    nouns = {f"{noun}.{name}" for noun, protocol in NOUNS.items()
             for name in protocol_methods(protocol)}
    return nouns | set(protocol_methods(Store))


def called(sources: Iterable[str]) -> set[str]:
    """What the test functions of `sources` call: `noun.method` on a noun attribute,
    and the bare method of anything else (an intent on the store)."""
    found: set[str] = set()
    for source in sources:
        for node in ast.parse(source).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            for sub in ast.walk(node):
                if not isinstance(sub, ast.Attribute):
                    continue
                on = sub.value
                if isinstance(on, ast.Attribute) and on.attr in NOUNS:
                    found.add(f"{on.attr}.{sub.attr}")
                else:
                    found.add(sub.attr)
    return found


def _suite() -> list[str]:
    return [path.read_text() for path in sorted(SUITE.glob("test_*.py"))
            if path.name != Path(__file__).name]


def test_every_protocol_method_has_a_contract_test() -> None:
    assert sorted(required() - called(_suite())) == []


def test_every_noun_method_a_test_calls_is_one_its_protocol_declares() -> None:
    asked = {name for name in called(_suite()) if "." in name}
    assert sorted(asked - required()) == []


def test_the_check_names_a_method_no_test_calls() -> None:
    one = ("def test_a(store):\n    store.apps.get_app('x')\n    store.install('h')\n"
           "def helper(store):\n    store.apps.list_apps()\n")
    missing = required() - called([one])
    assert "apps.get_app" not in missing and "install" not in missing
    assert {"apps.list_apps", "routes.set_route", "park"} <= missing
