"""Every path that makes an instance lays it down whole before anything of it runs: its
data dir, an empty WAL database at KEELWAY_DB and its key (keelway/deploy/instances.py
`lay_down`). The app here refuses to start without its database file, as real ones do."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

NEEDS_DB = Path(__file__).parent / "apps" / "needs_db"


def _first_steps(kw: Keelway, app: str, host: str) -> list[dict[str, Any]]:
    ops = kw.ok("ops", app, "--json").json()["operations"]
    first = min((op for op in ops if op["instance"] == host), key=lambda op: op["id"])
    return list(first["steps"])


def _laid_down(kw: Keelway, app: str, host: str) -> None:
    db = kw.home / "data" / host / "db.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    step = _first_steps(kw, app, host)[0]
    assert (step["name"], step["state"]) == ("lay down", "succeeded"), step
    assert step["detail"] == "made database and key"


def test_every_path_that_makes_an_instance_lays_down_its_database_before_it_runs(
    kw_root: Keelway,
) -> None:
    kw = kw_root
    kw.up("--demo")
    _laid_down(kw, "demo", "demo.localhost")  # `up --demo`

    kw.ok("deploy", "strict", str(NEEDS_DB), "--host", "one.test")  # `deploy --host`
    kw.ok("deploy", "plain", str(NEEDS_DB))  # the implicit APP.localhost
    kw.ok("instances", "add", "strict", "two.test")  # `instances add`
    for app, host in (("strict", "one.test"), ("plain", "plain.localhost"),
                      ("strict", "two.test")):
        status, body, _ = kw.get(host)
        assert (status, body.decode()) == (200, f"{host} has its database (wal)\n")
        if host != "two.test":  # added instances are laid down by their batch's step
            _laid_down(kw, app, host)
