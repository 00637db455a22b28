"""Seed import and rollback through the real CLI against a real daemon: the instance
serves the seed's rows, then its own again; the other instance never changes."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from keelway.runtime.environment import INSTANCE_KEY, read_env_file
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"
OTHER = "two.test"


def _seed(path: Path, visits: int) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE visits (n INTEGER NOT NULL)")
    conn.executemany("INSERT INTO visits VALUES (1)", [()] * visits)
    conn.commit()
    conn.close()
    return path


def _visit(kw: Keelway, host: str) -> str:
    status, body, _ = kw.get(host)
    assert status == 200, body
    return body.decode()


def _sum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_seed_serves_then_rolls_back_to_the_instance_s_own_data_and_key(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST, "--host", OTHER)
    for _ in range(3):
        _visit(kw, HOST)
    _visit(kw, OTHER)
    key = read_env_file(kw.home / "env" / f"{HOST}.env")[INSTANCE_KEY]
    other_route = [r for r in kw.store_dump()["routes"] if r["host"] == OTHER]
    other_env = (kw.home / "env" / f"{OTHER}.env").read_text()
    seed = _seed(tmp_path / "seed.sqlite3", 100)

    plan = kw.ok("seed", "import", HOST, str(seed), "--dry-run", "--json").json()
    assert plan["outcome"] == "dry-run" and kw.ok("seed", "status", HOST, "--json").json()[
        "journal"] is None
    done = kw.ok("seed", "import", HOST, str(seed), "--json").json()
    assert done["outcome"] == "imported"
    assert wait_until(lambda: kw.get(HOST, "/health")[0] == 200, 15)
    assert "visit 101" in _visit(kw, HOST)
    status = kw.ok("seed", "status", HOST, "--json").json()
    assert status["journal"]["state"] == "swapped" and status["marker"] == done["seed"]
    assert key not in json.dumps(status)
    shown = kw.ok("status", "--json").json()
    assert key not in json.dumps(shown)
    seen = {i["host"]: i["seed"] for a in shown["apps"] for i in a["instances"]}
    assert seen[HOST] == {"seed": done["seed"], "state": "swapped"} and seen[OTHER] is None

    refused = kw.run("seed", "import", HOST, str(seed), "--json")
    assert refused.code != 0 and "journaled" in refused.out

    undone = kw.ok("seed", "rollback", HOST, "--json").json()
    assert undone["outcome"] == "rolled-back"
    assert wait_until(lambda: kw.get(HOST, "/health")[0] == 200, 15)
    assert "visit 4" in _visit(kw, HOST)
    assert read_env_file(kw.home / "env" / f"{HOST}.env")[INSTANCE_KEY] == key
    assert kw.ok("seed", "status", HOST, "--json").json()["journal"] is None
    assert all(i["seed"] is None for a in kw.ok("status", "--json").json()["apps"]
               for i in a["instances"])
    assert not (kw.home / "data" / HOST / "seed").exists()
    assert [r for r in kw.store_dump()["routes"] if r["host"] == OTHER] == other_route
    assert (kw.home / "env" / f"{OTHER}.env").read_text() == other_env
    assert "visit 2" in _visit(kw, OTHER)


def test_a_damaged_seed_is_refused_through_the_cli_with_nothing_changed(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw, HOST)
    bad = tmp_path / "bad.sqlite3"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x01" * 5000)
    before, db = kw.store_dump(), _sum(kw.home / "data" / HOST / "db.sqlite3")
    refused = kw.run("seed", "import", HOST, str(bad), "--json")
    assert refused.code != 0
    assert json.loads(refused.out)["error"]["message"].startswith("seed refused")
    after = kw.store_dump()
    assert after["routes"] == before["routes"] and after["fences"] == before["fences"]
    assert _sum(kw.home / "data" / HOST / "db.sqlite3") == db
    # Nothing of the seed is stored; the running instance's replica lives there too.
    assert [p.name for p in (kw.home / "objects").glob("*")] in ([], ["replicas"])
    assert kw.get(HOST, "/health")[0] == 200


def test_a_snapshot_of_another_instance_is_a_seed_by_its_id_through_the_cli(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST, "--host", OTHER)
    _visit(kw, HOST)
    for _ in range(5):
        _visit(kw, OTHER)
    snap = kw.ok("db", "snapshot", OTHER, "--json").json()["id"]
    refused = kw.run("seed", "import", HOST, f"Not_A_Host/{snap}", "--json")
    assert refused.code != 0 and kw.ok("seed", "status", HOST, "--json").json()[
        "journal"] is None
    done = kw.ok("seed", "import", HOST, snap, "--json").json()
    assert done["outcome"] == "imported"
    assert wait_until(lambda: kw.get(HOST, "/health")[0] == 200, 15)
    assert "visit 6" in _visit(kw, HOST)  # OTHER's five rows, then this one
    assert "visit 6" in _visit(kw, OTHER)  # OTHER's own data goes on as it was


def test_the_cli_shows_what_a_seed_brings_and_refuses_an_empty_one_unless_allowed(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw, HOST)
    seed = _seed(tmp_path / "seed.sqlite3", 7)
    said = kw.ok("seed", "import", HOST, str(seed), "--dry-run")
    assert "visits: 7 rows" in said.out and "no -wal beside it" in said.out
    plan = kw.ok("seed", "import", HOST, str(seed), "--dry-run", "--json").json()
    assert plan["contents"]["tables"] == [{"name": "visits", "rows": 7}]
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    before, db = kw.store_dump(), _sum(kw.home / "data" / HOST / "db.sqlite3")
    refused = kw.run("seed", "import", HOST, str(empty), "--json")
    assert refused.code != 0
    error = json.loads(refused.out)["error"]
    assert "is empty (0 bytes)" in error["message"] and "--allow-empty" in error["hint"]
    assert kw.store_dump()["routes"] == before["routes"]
    assert _sum(kw.home / "data" / HOST / "db.sqlite3") == db
    done = kw.ok("seed", "import", HOST, str(seed))
    assert "imported" in done.out and "visits: 7 rows" in done.out
    kw.ok("seed", "rollback", HOST)
    kw.ok("seed", "import", HOST, str(empty), "--allow-empty")
