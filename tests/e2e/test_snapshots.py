"""Snapshots and restore of an instance's database, through the real CLI and daemon."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from keelway.api.daemon import wire
from keelway.data.objects import LocalObjects
from keelway.deploy.publisher import Publisher
from keelway.deploy.snapshots import SCHEDULE_S
from keelway.home import Home as KeelwayHome
from keelway.runtime.supervisor import Supervisor
from keelway.store import SqliteStore
from keelway.store.records import Generation
from keelway.testing.clock import FakeClock
from tests.e2e.harness import EXAMPLE, Keelway
from tests.s3server import S3Server, s3_env, s3_server

__all__ = ["s3_env", "s3_server"]  # fixtures

pytestmark = pytest.mark.slow

HOST = "one.test"
OTHER = "two.test"


def _visit(kw: Keelway, host: str = HOST) -> int:
    status, body, _ = kw.get(host)
    assert status == 200, body
    return int(body.decode().rsplit("visit ", 1)[1])


def _instance_state(kw: Keelway, host: str) -> str:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return str(inst["state"])
    raise AssertionError(f"no instance {host}")


def _stored(kw: Keelway, snap_id: str) -> Path:
    return kw.home / "objects" / "instances" / HOST / "snapshots" / f"{snap_id}.db"


def test_a_restore_brings_back_the_rows_of_the_snapshot(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST, "--host", OTHER)
    for _ in range(3):
        _visit(kw)
    assert _visit(kw, OTHER) == 1
    snap = kw.ok("db", "snapshot", HOST, "--json").json()
    assert snap["instance"] == HOST and snap["release"] == 1
    listed = kw.ok("db", "snapshots", HOST, "--json").json()["snapshots"]
    assert [s["id"] for s in listed] == [snap["id"]]
    assert kw.ok("db", "verify", HOST, snap["id"], "--json").json()["ok"] is True
    for stored in (_stored(kw, snap["id"]), _stored(kw, snap["id"]).with_suffix(".json")):
        assert stored.stat().st_mode & 0o777 == 0o600  # a tenant's data, owner-only
    assert (kw.home / "objects").stat().st_mode & 0o777 == 0o700
    assert _visit(kw) == 4 and _visit(kw) == 5
    before = kw.app_pids()

    done = kw.ok("db", "restore", HOST, snap["id"], "--json").json()

    assert done["state"] == "running"
    assert _visit(kw) == 4  # the three visits of the snapshot, then this one
    assert _visit(kw, OTHER) == 2  # the other instance's database was not touched
    after = kw.app_pids()
    assert len(after) == len(before) and set(after) != set(before)  # HOST restarted
    data = kw.home / "data" / HOST
    assert sorted(p.name for p in data.iterdir() if "restore" in p.name or "incoming"
                  in p.name or p.name.startswith(".tmp-")) == []
    # The replaced database is kept, whole, with the visits it had (invariant 7).
    [copy] = [c for c in done["kept"] if c["kind"] == "database"]
    assert done["source"] == "snapshot" and Path(copy["path"]).parent == data / "kept"
    kept = sqlite3.connect(Path(copy["path"]) / "db.sqlite3")
    assert kept.execute("SELECT COUNT(*) FROM visits").fetchone()[0] == 5
    kept.close()
    # Listed, and removed only when the operator says so.
    listed = kw.ok("db", "kept", HOST, "--json").json()["kept"]
    assert [c["id"] for c in listed] == [c["id"] for c in done["kept"]]
    said = kw.ok("db", "restore", HOST, snap["id"])
    assert said.out.count("  db-") == 2 and "keelway db forget" in said.out
    kw.ok("db", "forget", HOST, copy["id"])
    left = kw.ok("db", "kept", HOST, "--json").json()["kept"]
    assert copy["id"] not in [c["id"] for c in left] and len(left) == 3  # two restores kept 4
    ops = kw.ok("ops", "hello", "--instance", HOST, "--json").json()
    assert any(op["kind"] == "restore" and op["state"] == "succeeded"
               for op in (ops["operations"] if isinstance(ops, dict) else ops))


def test_a_damaged_snapshot_is_refused_at_restore_and_nothing_changes(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()
    stored = _stored(kw, snap["id"])
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    stored.write_bytes(bytes(raw))
    _visit(kw)
    pids = kw.app_pids()

    verified = kw.run("db", "verify", HOST, snap["id"], "--json")
    refused = kw.run("db", "restore", HOST, snap["id"], "--json")

    assert verified.code != 0 and "snapshot-refused" in verified.out + verified.err
    assert refused.code != 0 and "snapshot-refused" in refused.out + refused.err
    assert "sha256" in refused.out + refused.err
    assert kw.app_pids() == pids
    assert _visit(kw) == 3  # the database went on as it was
    unknown = kw.run("db", "restore", HOST, "20200101T000000000000Z-0000", "--json")
    assert unknown.code != 0 and "not-found" in unknown.out + unknown.err
    bad = kw.run("db", "restore", HOST, "../../etc", "--json")
    assert bad.code != 0 and "bad-request" in bad.out + bad.err


def test_a_parked_instance_is_snapshotted_restored_and_stays_parked(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw)
    _visit(kw)
    kw.ok("park", HOST)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()
    kw.ok("wake", HOST)
    _visit(kw)
    kw.ok("park", HOST)

    done = kw.ok("db", "restore", HOST, snap["id"], "--json").json()

    assert done["state"] == "parked" and _instance_state(kw, HOST) == "parked"
    assert kw.app_pids() == []
    assert _visit(kw) == 3  # the request wakes it, on the restored rows


def _app_with_data(tmp_path: Path, data: str) -> Path:
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    with open(app / "keelway.toml", "a") as toml:
        toml.write(f"\n[data]\n{data}\n")
    return app


def test_gc_prunes_each_instances_snapshots_beyond_its_keep(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(_app_with_data(tmp_path, "keep = 2")), "--host", HOST)
    made = [kw.ok("db", "snapshot", HOST, "--json").json()["id"] for _ in range(3)]

    dry = kw.ok("gc", "--dry-run", "--json").json()
    done = kw.ok("gc", "--json").json()

    assert dry["snapshots_removed"] == [{"instance": HOST, "id": made[0]}]
    assert done["snapshots_removed"] == [{"instance": HOST, "id": made[0]}]
    listed = kw.ok("db", "snapshots", HOST, "--json").json()["snapshots"]
    assert [s["id"] for s in listed] == made[1:]


def test_the_schedule_takes_due_snapshots_and_keeps_only_keep(kw: Keelway,
                                                              tmp_path: Path) -> None:
    kw.up()
    app = _app_with_data(tmp_path, 'snapshot_every = "1m"\nkeep = 2')
    kw.ok("deploy", "hello", str(app), "--host", HOST)
    _visit(kw)
    kw.ok("down")  # the schedule below runs on this home's records, in this process
    store = SqliteStore(kw.home / "keelway.db", FakeClock())
    # The fake time runs behind the files' real mtimes: every pass sees a changed file.
    clock = FakeClock(start=time.time() - 100_000)
    home = KeelwayHome(kw.home)

    async def on_exit(_gen: Generation, _code: int | None) -> None:
        return None

    # A store of its own: the daemon's schedule may have taken one of its own meanwhile.
    part = wire(store, home, Supervisor(store, home, clock, on_exit),
                Publisher(store, home.router_socket), clock, "test",
                LocalObjects(tmp_path / "objects")).snapshots

    async def passes(count: int) -> None:
        # What `schedule` does every SCHEDULE_S, pass by pass, so none is cut short.
        for _ in range(count):
            await clock.sleep(SCHEDULE_S)
            await part.take_due()

    try:
        asyncio.run(passes(11))  # 330 s
        listed = asyncio.run(part.stored(HOST))
        clock.advance(200_000)  # now past the file's mtime: one more, then it is unchanged
        once = asyncio.run(part.take_due())
        clock.advance(120)
        again = asyncio.run(part.take_due())
    finally:
        store.close()
    assert len(listed) == 2
    assert listed[1].taken_at - listed[0].taken_at >= 60
    assert all(m.release == 1 for m in listed)
    assert (once, again) == ([HOST], [])  # nothing wrote the database since


def test_up_with_objects_keeps_snapshots_in_s3_and_a_later_up_keeps_it(
        kw: Keelway, s3_env: S3Server) -> None:
    url = f"s3://{s3_env.bucket}/e2e-{os.getpid()}"
    kw.up("--objects", url)
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()
    assert not (kw.home / "objects").exists()  # nothing went to the local store
    kw.ok("down")
    kw.up()  # no --objects: the store named before is kept
    listed = kw.ok("db", "snapshots", HOST, "--json").json()["snapshots"]
    assert [s["id"] for s in listed] == [snap["id"]]
    assert kw.ok("db", "verify", HOST, snap["id"], "--json").json()["ok"] is True
    _visit(kw)
    kw.ok("db", "restore", HOST, snap["id"])
    assert _visit(kw) == 2


def test_up_refuses_an_objects_url_it_cannot_use(kw: Keelway) -> None:
    bad = kw.run("up", "-d", "--http", f"127.0.0.1:{kw.http_port}", "--objects",
                 "ftp://nope", "--json")
    assert bad.code != 0 and "s3://" in bad.out + bad.err
    assert not (kw.home / "objects.url").exists()


def test_a_stopped_instance_is_restored_and_stays_stopped_and_a_fenced_one_is_refused(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    _visit(kw)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()
    _visit(kw)
    kw.ok("fence", HOST)
    fenced = kw.run("db", "restore", HOST, snap["id"], "--json")
    assert fenced.code != 0 and "fenced" in fenced.out + fenced.err
    assert _visit(kw) == 3  # refused: nothing stopped, nothing swapped
    kw.ok("unfence", HOST)
    kw.ok("stop", "hello")

    done = kw.ok("db", "restore", HOST, snap["id"], "--json").json()

    assert done["state"] == "stopped" and kw.app_pids() == []
    kw.ok("start", "hello")
    assert _visit(kw) == 2
