"""The store's boundary, checked: no module outside keelway/store opens a transaction or
speaks SQL. An effect that needs rows written together is an intent of the store."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "keelway"

# Calls that open a transaction or run SQL on a connection (`connect` only on sqlite3:
# sockets connect too).
_TRANSACTION_CALLS = {"tx", "_tx", "transaction", "execute", "executemany", "executescript"}
# SQL as SQLite is written here: upper-case verbs (the "rollback" operation is not SQL).
_SQL = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|INSERT INTO|DELETE FROM"
                  r"|UPDATE \w+ SET|SELECT .+ FROM|PRAGMA)\b")


def _transactions_opened(path: Path, root: Path) -> list[str]:
    where = path.relative_to(root)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            on = node.func.value
            if node.func.attr in _TRANSACTION_CALLS or (
                    node.func.attr == "connect" and isinstance(on, ast.Name)
                    and on.id == "sqlite3"):
                found.append(f"{where}:{node.lineno} calls .{node.func.attr}(")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _SQL.match(node.value)):
            found.append(f"{where}:{node.lineno} writes SQL")
    return found


# keelway/data opens *instance* databases (an app's own SQLite file: a restored copy's
# integrity check, a checkpoint before a swap), never keelway.db; keelway's own records
# stay behind the store's intents.
_INSTANCE_DATABASES = {"store", "data"}


def _outside_the_store(root: Path) -> list[str]:
    return [hit for path in sorted(root.rglob("*.py"))
            if path.relative_to(root).parts[0] not in _INSTANCE_DATABASES
            for hit in _transactions_opened(path, root)]


def test_no_module_outside_the_store_opens_a_transaction_or_writes_sql() -> None:
    assert _outside_the_store(PACKAGE) == []


def test_the_boundary_check_sees_a_caller_that_opens_a_transaction(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "deploy" / "attempt.py").write_text(
        "def install(store):\n    with store.tx():\n        store.set_active()\n"
        "    store._conn.execute(\"UPDATE routes SET port=1\")\n")
    (tmp_path / "store" / "sqlite.py").write_text("def f(s):\n    with s.tx():\n        pass\n")
    assert sorted(_outside_the_store(tmp_path)) == [
        "deploy/attempt.py:2 calls .tx(", "deploy/attempt.py:4 calls .execute(",
        "deploy/attempt.py:4 writes SQL"]
