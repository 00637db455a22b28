"""Tenants whole, through the real CLI: apps created before their first deploy, instances
laid down whole, aliases that serve the same instance, removal and destroy, and bad
input that changes nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from keelway.data.instance_db import is_empty_wal
from keelway.runtime import process
from tests.e2e.harness import Keelway
from tests.invariants import violations

pytestmark = pytest.mark.slow

# A web that says what it was started with: its config, and whether its database was
# there before it opened anything (the app of issue 10 that failed on its first start).
ENV_WEB = '''\
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DB_EXISTED = os.path.exists(os.environ["KEELWAY_DB"])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({
            "instance": os.environ["KEELWAY_INSTANCE"], "pid": os.getpid(),
            "greeting": os.environ.get("GREETING"), "tier": os.environ.get("TIER"),
            "db_existed": DB_EXISTED,
            "has_key": bool(os.environ.get("KEELWAY_INSTANCE_KEY")),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''


def _env_app(root: Path) -> Path:
    app = root / "envapp"
    app.mkdir(parents=True)
    (app / "web.py").write_text(ENV_WEB)
    (app / "Procfile").write_text("web: python3 web.py\n")
    (app / "keelway.toml").write_text(
        '[services.web]\nhealth = "/health"\nsettle = "0.2s"\nstop_grace = "2s"\n')
    return app


def _info(kw: Keelway, host: str) -> dict[str, object]:
    code, body, _ = kw.get(host, "/")
    assert code == 200, (host, code, body)
    info: dict[str, object] = json.loads(body)
    return info


def _pids(kw: Keelway, host: str) -> list[tuple[int, int]]:
    status = kw.ok("status", "--json").json()
    found = []
    for app in status["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                for proc in inst["processes"]:
                    stat = process.read_stat(proc["pid"]) if proc["pid"] else None
                    if stat is not None:
                        found.append((proc["pid"], stat.start_ticks))
    return found


def test_an_app_lives_whole_from_create_to_destroy_and_its_name_is_used_again(
        kw: Keelway, tmp_path: Path) -> None:
    app = _env_app(tmp_path / "src")
    kw.up()
    kw.ok("apps", "create", "shop")
    kw.ok("config", "shop", "set", "GREETING=hi")  # before the first deploy
    added = kw.ok("instances", "add", "shop", "a.shop.test", "b.shop.test",
                  "--config", "TIER=gold", "--json").json()
    assert added["added"] == ["a.shop.test", "b.shop.test"] and added["started"] == []
    # Laid down whole before anything runs: an empty WAL database, a private env file
    # holding a minted key.
    for host in ("a.shop.test", "b.shop.test"):
        db = kw.home / "data" / host / "db.sqlite3"
        assert db.exists() and (db.stat().st_mode & 0o777) == 0o600 and is_empty_wal(db)
        env = kw.home / "env" / f"{host}.env"
        assert (env.stat().st_mode & 0o777) == 0o600
        assert "KEELWAY_INSTANCE_KEY=" in env.read_text()

    # A deploy with no --host goes to exactly the app's instances.
    kw.ok("deploy", "shop", str(app))
    listed = kw.ok("instances", "list", "shop", "--json").json()["instances"]
    assert [i["host"] for i in listed] == ["a.shop.test", "b.shop.test"]
    a = _info(kw, "a.shop.test")
    assert a == {"instance": "a.shop.test", "pid": a["pid"], "greeting": "hi", "tier": "gold",
                 "db_existed": True, "has_key": True}

    # Instance config over the app's: only that instance restarts with it.
    kw.ok("config", "shop", "--instance", "b.shop.test", "set", "TIER=silver")
    assert _info(kw, "b.shop.test")["tier"] == "silver"
    assert _info(kw, "a.shop.test")["tier"] == "gold"
    shown = kw.ok("config", "shop", "--instance", "b.shop.test", "--json").json()
    assert shown["effective"] == {"GREETING": "hi", "TIER": "silver"}

    # An alias serves the same instance: the same process answers.
    kw.ok("domains", "add", "a.shop.test", "www.a.test", "a.example")
    assert kw.ok("domains", "list", "a.shop.test", "--json").json()["aliases"] == [
        "a.example", "www.a.test"]
    alias = _info(kw, "www.a.test")
    assert alias["instance"] == "a.shop.test" and alias["pid"] == a["pid"]
    # ... and keeps serving it across a redeploy (its route moves with the primary's).
    kw.ok("deploy", "shop", str(app))
    moved = _info(kw, "www.a.test")
    assert moved["pid"] == _info(kw, "a.shop.test")["pid"] != a["pid"]
    kw.ok("domains", "remove", "a.shop.test", "a.example")
    assert kw.get("a.example")[0] == 404
    assert violations(kw.home) == []

    # Removal: processes proven gone, routes withdrawn, data kept.
    b_pids = _pids(kw, "b.shop.test")
    assert b_pids
    kw.ok("instances", "remove", "shop", "b.shop.test")
    assert all(not process.is_alive(pid, ticks) for pid, ticks in b_pids)
    assert kw.get("b.shop.test")[0] == 404
    assert (kw.home / "data" / "b.shop.test" / "db.sqlite3").exists()
    assert [i["host"] for i in kw.ok("instances", "list", "shop", "--json").json()[
        "instances"]] == ["a.shop.test"]

    # Destroy: refused without --yes, then everything of the app goes but its data.
    before = kw.store_dump()
    refused = kw.run("apps", "destroy", "shop", "--json")
    assert refused.code != 0 and "--yes" in json.loads(refused.out)["error"]["hint"]
    assert kw.store_dump() == before
    a_pids = _pids(kw, "a.shop.test")
    kw.ok("apps", "destroy", "shop", "--yes")
    assert all(not process.is_alive(pid, ticks) for pid, ticks in a_pids)
    assert kw.get("a.shop.test")[0] == 404 and kw.get("www.a.test")[0] == 404
    assert kw.ok("apps", "--json").json()["apps"] == []
    assert not (kw.home / "builds" / "shop").exists() or not any(
        (kw.home / "builds" / "shop").iterdir())
    assert (kw.home / "data" / "a.shop.test" / "db.sqlite3").exists()
    assert violations(kw.home) == []

    # The name is free again: a fresh app, release v1, its old data dir served again.
    out = kw.ok("deploy", "shop", str(app), "--host", "a.shop.test", "--json").json()
    assert [i["release"] for i in out["instances"]] == ["v1"]
    again = _info(kw, "a.shop.test")
    assert again["greeting"] is None and again["tier"] is None and again["db_existed"]
    assert violations(kw.home) == []


def test_adding_to_a_deployed_app_starts_the_new_instances_on_its_release(
        kw: Keelway, tmp_path: Path) -> None:
    app = _env_app(tmp_path / "src")
    kw.up()
    kw.ok("deploy", "shop", str(app), "--host", "a.shop.test")
    added = kw.ok("instances", "add", "shop", "c.shop.test", "--json").json()
    assert [(s["host"], s["release"], s["outcome"]) for s in added["started"]] == [
        ("c.shop.test", "v1", "done")]
    assert _info(kw, "c.shop.test")["db_existed"] is True
    assert kw.ok("releases", "shop", "--json").json()["releases"][0]["version"] == "v1"
    assert violations(kw.home) == []


def test_bad_tenant_input_is_refused_and_changes_nothing(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("apps", "create", "shop")
    kw.ok("instances", "add", "shop", "a.shop.test")
    kw.ok("domains", "add", "a.shop.test", "www.a.test")
    before = kw.store_dump()
    data = sorted(p.name for p in (kw.home / "data").iterdir())
    bad = [
        ("instances", "add", "shop", "ok.test", "Bad_Host"),
        ("instances", "add", "shop", "ok.test", "ok.test"),
        ("instances", "add", "shop", "ok.test", "a.shop.test"),
        ("instances", "add", "shop", "ok.test", "www.a.test"),
        ("instances", "add", "shop", "ok.test", "--config", "KEELWAY_X=1"),
        ("instances", "add", "shop", "ok.test", "--config", "nope"),
        ("instances", "add", "nosuch", "ok.test"),
        ("instances", "remove", "shop", "nosuch.test"),
        ("domains", "add", "a.shop.test", "a.shop.test"),
        ("domains", "add", "www.a.test", "x.test"),
        ("domains", "add", "a.shop.test", "bad-.test"),
        ("domains", "remove", "a.shop.test", "x.test"),
        ("apps", "create", "shop"),
        ("apps", "create", "Bad"),
        ("apps", "destroy", "shop"),
        ("deploy", "shop", str(tmp_path), "--host", "www.a.test"),
        ("config", "shop", "--instance", "nosuch.test", "set", "A=1"),
    ]
    for args in bad:
        result = kw.run(*args, "--json")
        assert result.code != 0, args
        error = json.loads(result.out)["error"]
        assert error["message"] and error["code"] != "internal", (args, error)
    assert kw.store_dump() == before
    assert sorted(p.name for p in (kw.home / "data").iterdir()) == data


def test_adding_500_instances_is_one_fast_request(kw: Keelway) -> None:
    kw.up()
    kw.ok("apps", "create", "shop")
    hosts = [f"t{n}.shop.test" for n in range(500)]
    began = time.monotonic()
    out = kw.ok("instances", "add", "shop", *hosts, "--json").json()
    took_s = time.monotonic() - began
    print(f"\n500 instances added in {took_s:.2f}s (server side {out['seconds']}s)")
    assert len(out["added"]) == 500
    assert took_s < 5.0
    assert all((kw.home / "data" / h / "db.sqlite3").exists() for h in hosts)
    assert len(os.listdir(kw.home / "env")) >= 500
    ops = kw.ok("ops", "shop", "--json").json()["operations"]
    assert [(o["kind"], o["state"], [s["name"] for s in o["steps"]]) for o in ops] == [
        ("add-instances", "succeeded", ["lay down"])]


def test_the_dry_runs_of_add_remove_and_destroy_print_their_steps_and_change_nothing(
        kw: Keelway, tmp_path: Path) -> None:
    app = _env_app(tmp_path / "src")
    kw.up()
    kw.ok("deploy", "shop", str(app), "--host", "a.shop.test")
    before = kw.ok("instances", "list", "shop", "--json").json()
    said = kw.ok("instances", "add", "shop", "c.shop.test", "--dry-run").out
    assert "lay-down" in said and "start c.shop.test on v1" in said
    plan = kw.ok("instances", "remove", "shop", "a.shop.test", "--dry-run", "--json").json()
    (removal,) = plan["plans"]
    steps = [s["step"] for s in removal["steps"]]
    assert removal["op"] == "remove-instance" and steps[0] == "withdraw"
    assert steps[-1] == "forget"
    said = kw.ok("apps", "destroy", "shop", "--dry-run").out
    assert "remove-builds" in said and "forget" in said
    assert kw.ok("instances", "list", "shop", "--json").json() == before
    kinds = {op["kind"] for op in kw.ok("ops", "shop", "--json").json()["operations"]}
    assert not kinds & {"add-instances", "remove-instance", "destroy"}
