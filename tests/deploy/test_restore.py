"""The one restore and the drill, in process, on a real store, home, SQLite files and
litestream (no router, no app processes: the instances are parked)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from keelway.api.daemon import DeployParts
from keelway.data import swap
from keelway.data.replicas import litestream_binary
from keelway.deploy.errors import UserError
from keelway.home import Home
from keelway.journal import StepKind
from keelway.store import SqliteStore
from keelway.store.lifecycle import InstanceState
from tests.deploy.wiring import wired

HOST = "acme.shop.test"
OTHER = "globex.shop.test"


@pytest.fixture
def parts(tmp_path: Path) -> tuple[DeployParts, SqliteStore, Home]:
    deploy, store, home = wired(tmp_path)
    deploy.tenants.create_app("shop")
    asyncio.run(deploy.tenants.add_instances("shop", [HOST, OTHER], {}))
    for host in (HOST, OTHER):  # no router here to publish a held route to
        inst = store.get_instance(host)
        assert inst is not None
        store.park(inst)
    return deploy, store, home


def _add(db: Path, *rows: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(r,) for r in rows])
    conn.commit()
    conn.close()


def _rows(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY rowid")]
    finally:
        conn.close()


def _steps(store: SqliteStore, op_id: int | None) -> list[StepKind]:
    assert op_id is not None
    return [s.kind for s in store.steps(op_id)]


@pytest.mark.skipif(litestream_binary() is None, reason="no litestream binary")
def test_a_replica_restore_after_a_snapshot_restore_gives_the_snapshots_rows(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    db = home.db_path(HOST)
    replicas = deploy.recovery.replicas
    assert replicas is not None

    async def run() -> None:
        _add(db, "a")
        snap = await deploy.snapshots.snapshot(HOST)
        _add(db, "b", "c")
        assert await replicas.stop(HOST, sync=True) is None  # the replica holds a, b, c
        done = await deploy.snapshots.restore(HOST, snap.id)
        assert done.source == "snapshot" and done.state is InstanceState.PARKED
        assert _rows(db) == ["a"]
        assert done.kept is not None and _rows(Path(done.kept) / db.name) == ["a", "b", "c"]
        # The replica set aside before the swap, a new one begun from the file after it.
        assert _steps(store, done.op_id) == [StepKind.REPLICA_RESET, StepKind.SWAP_DB,
                                             StepKind.REPLICA_STOP]
        # The replica the old file wrote is kept aside, and a new one holds the snapshot.
        again = await deploy.replication.restore(HOST)
        assert again.source == "replica" and again.snapshot is None
        assert _rows(db) == ["a"]
        assert _rows(swap.previous(db) / db.name) == ["a"]  # only the latest replaced

    asyncio.run(run())
    replica_dir = Path(replicas.url(HOST).removeprefix("file://"))
    assert replica_dir.with_name(f"{replica_dir.name}.replaced").is_dir()
    assert sorted(p.name for p in db.parent.iterdir()
                  if p.name.startswith(".tmp") or "incoming" in p.name) == []


def test_a_damaged_snapshot_is_refused_and_nothing_changes(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    db = home.db_path(HOST)
    _add(db, "a")
    snap = asyncio.run(deploy.snapshots.snapshot(HOST))
    _add(db, "b")
    stored = home.objects_dir / "instances" / HOST / "snapshots" / f"{snap.id}.db"
    assert stored.is_file()
    data = bytearray(stored.read_bytes())
    data[-100:] = b"\x00" * 100
    stored.write_bytes(bytes(data))
    ops_before = store.latest_operation(HOST)
    with pytest.raises(UserError, match=r"failed verification.*nothing was changed"):
        asyncio.run(deploy.snapshots.restore(HOST, snap.id))
    assert _rows(db) == ["a", "b"] and not swap.previous(db).exists()
    assert store.latest_operation(HOST) == ops_before
    assert [p.name for p in db.parent.iterdir() if p.name.startswith(".tmp")] == []


def test_a_drill_checks_the_newest_snapshot_and_a_corrupted_one_fails_with_an_event(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    _add(home.db_path(HOST), "a")
    asyncio.run(deploy.snapshots.snapshot(HOST))
    [one, other] = sorted(asyncio.run(deploy.replication.drill()), key=lambda r: r["host"])
    assert one["host"] == HOST and one["ok"] is True and "snapshot" in one["checked"]
    assert other["snapshot"]["ok"] is None and "skipped" in other["snapshot"]
    newest = asyncio.run(deploy.snapshots.stored(HOST))[-1]
    stored = home.objects_dir / "instances" / HOST / "snapshots" / f"{newest.id}.db"
    stored.write_bytes(stored.read_bytes()[:-4096])
    [failed] = asyncio.run(deploy.replication.drill(HOST))
    assert failed["ok"] is False and failed["snapshot"]["ok"] is False
    assert newest.id in failed["snapshot"]["id"]
    events = [e for e in store.list_events("shop", limit=50) if e.instance == HOST]
    assert events[-1].kind == "drill-failed" and events[-1].message.startswith("snapshot:")


def test_an_old_journals_replica_swap_step_still_reads_as_a_swap() -> None:
    # Every kind has a label of its own (tests/test_journal.py); the retired one says
    # it is the same swap, from an older journal.
    old = StepKind("swap-database").label(None)
    assert old.startswith(StepKind.SWAP_DB.label(None)) and old != StepKind.SWAP_DB.label(None)
