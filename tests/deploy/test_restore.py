"""The one restore and the drill, in process, on a real store, home, SQLite files and
litestream (no router, no app processes: the instances are parked)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from keelway.api.daemon import DeployParts
from keelway.data import kept
from keelway.data.replicas import litestream_binary
from keelway.deploy.errors import NotFoundError, UserError
from keelway.home import Home
from keelway.journal import StepKind
from keelway.store import SqliteStore
from keelway.store.lifecycle import InstanceState
from keelway.testing.dump import dump
from tests.deploy.wiring import wired

HOST = "acme.shop.test"
OTHER = "globex.shop.test"


@pytest.fixture
def parts(tmp_path: Path) -> tuple[DeployParts, SqliteStore, Home]:
    deploy, store, home = wired(tmp_path)
    deploy.apps.create_app("shop")
    asyncio.run(deploy.instances.add_instances("shop", [HOST, OTHER], {}))
    for host in (HOST, OTHER):  # no router here to publish a held route to
        inst = store.instances.get_instance(host)
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
    return [s.kind for s in store.ops.steps(op_id)]


@pytest.mark.skipif(litestream_binary() is None, reason="no litestream binary")
def test_a_replica_restore_after_a_snapshot_restore_gives_the_snapshots_rows(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    db = home.db_path(HOST)
    replicas = deploy.keeper.replicas
    assert replicas is not None

    async def run() -> None:
        _add(db, "a")
        snap = await deploy.snapshots.snapshot(HOST)
        _add(db, "b", "c")
        assert await replicas.stop(HOST, sync=True) is None  # the replica holds a, b, c
        done = await deploy.restore.restore(HOST, snap.id)
        assert done.source == "snapshot" and done.state is InstanceState.PARKED
        assert _rows(db) == ["a"]
        [old] = [c for c in done.kept if c.kind == "database"]
        assert _rows(old.path / db.name) == ["a", "b", "c"]
        # The replica set aside before the swap, a new one begun from the file after it.
        assert _steps(store, done.op_id) == [StepKind.REPLICA_RESET, StepKind.SWAP_DB,
                                             StepKind.REPLICA_STOP]
        # The replica the old file wrote is kept aside, and a new one holds the snapshot.
        again = await deploy.replication.restore(HOST)
        assert again.source == "replica" and again.snapshot is None
        assert _rows(db) == ["a"]
        assert [_rows(c.path / db.name) for c in kept.databases(db)] == [["a", "b", "c"],
                                                                        ["a"]]

    asyncio.run(run())
    assert len(kept.replicas(Path(replicas.url(HOST).removeprefix("file://")), {HOST})) == 2
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
    ops_before = store.ops.latest_operation(HOST)
    with pytest.raises(UserError, match=r"failed verification.*nothing was changed"):
        asyncio.run(deploy.restore.restore(HOST, snap.id))
    assert _rows(db) == ["a", "b"] and kept.databases(db) == []
    assert store.ops.latest_operation(HOST) == ops_before
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
    events = [e for e in store.ops.list_events("shop", limit=50) if e.instance == HOST]
    assert events[-1].kind == "drill-failed" and events[-1].message.startswith("snapshot:")


def test_an_old_journals_replica_swap_step_still_reads_as_a_swap() -> None:
    # Every kind has a label of its own (tests/test_journal.py); the retired one says
    # it is the same swap, from an older journal.
    old = StepKind("swap-database").label(None)
    assert old.startswith(StepKind.SWAP_DB.label(None)) and old != StepKind.SWAP_DB.label(None)


def _every_row_on_disk(db: Path) -> set[str]:
    """The rows of the database and of every copy of it anywhere in its data dir."""
    found = set(_rows(db))
    for copy in db.parent.rglob(db.name):
        if copy != db:
            found |= set(_rows(copy))
    return found


@pytest.mark.skipif(litestream_binary() is None, reason="no litestream binary")
def test_two_restores_in_a_row_snapshot_then_replica_lose_no_acknowledged_row(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, _store, home = parts
    db = home.db_path(HOST)
    replicas = deploy.keeper.replicas
    assert replicas is not None

    async def run() -> None:
        _add(db, "a")
        snap = await deploy.snapshots.snapshot(HOST)
        _add(db, "b", "c")  # acknowledged after the snapshot
        assert await replicas.stop(HOST, sync=True) is None
        first = await deploy.restore.restore(HOST, snap.id)
        _add(db, "d")  # written between the two restores, shipped to the new replica
        assert await replicas.stop(HOST, sync=True) is None
        _add(db, "e")  # acknowledged, not shipped yet
        second = await deploy.replication.restore(HOST)
        assert _rows(db) == ["a", "d"]
        # Both replaced databases are kept, and both replicas set aside.
        assert [_rows(c.path / db.name) for c in second.kept if c.kind == "database"] == [
            ["a", "b", "c"], ["a", "d", "e"]]
        assert {c.id for c in first.kept} < {c.id for c in second.kept}
        assert [c.kind for c in second.kept].count("replica") == 2

    asyncio.run(run())
    assert _every_row_on_disk(db) == {"a", "b", "c", "d", "e"}


def test_two_snapshot_restores_in_a_row_lose_no_acknowledged_row(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, _store, home = parts
    db = home.db_path(HOST)

    async def run() -> None:
        _add(db, "a")
        one = await deploy.snapshots.snapshot(HOST)
        _add(db, "b")
        two = await deploy.snapshots.snapshot(HOST)
        _add(db, "c")  # acknowledged after both snapshots
        await deploy.restore.restore(HOST, one.id)
        _add(db, "d")  # written between the two restores
        await deploy.restore.restore(HOST, two.id)
        assert _rows(db) == ["a", "b"]

    asyncio.run(run())
    assert _every_row_on_disk(db) == {"a", "b", "c", "d"}
    assert [_rows(c.path / db.name) for c in kept.databases(db)] == [["a", "b", "c"],
                                                                    ["a", "d"]]


def test_a_kept_copy_is_removed_by_forget_or_by_gc_once_past_the_retention(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, _store, home = parts
    db = home.db_path(HOST)

    async def run() -> None:
        _add(db, "a")
        snap = await deploy.snapshots.snapshot(HOST)
        for row in ("b", "c"):
            _add(db, row)
            await deploy.restore.restore(HOST, snap.id)
            await asyncio.sleep(1.1)  # a kept copy's name says its second
        old, new = kept.databases(db)
        with pytest.raises(NotFoundError):
            await deploy.restore.forget(HOST, "../../..")
        assert await deploy.restore.prune_kept(dry_run=False) == []
        # Seven days on, only the copy kept before then goes.
        later = old.kept_at + kept.RETENTION_S + 0.5
        assert new.kept_at > old.kept_at
        assert await deploy.restore.prune_kept(True, later) == [(HOST, old.id)]
        assert len(kept.databases(db)) == 2
        assert await deploy.restore.prune_kept(False, later) == [(HOST, old.id)]
        assert [c.id for c in kept.databases(db)] == [new.id]
        gone = await deploy.restore.forget(HOST, new.id)
        assert gone.id == new.id and kept.databases(db) == []

    asyncio.run(run())
    assert _rows(db) == ["a"]


def test_a_restores_dry_run_changes_nothing_and_is_the_plan_the_restore_journals(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    db = home.db_path(HOST)

    async def run() -> None:
        _add(db, "a")
        snap = await deploy.snapshots.snapshot(HOST)
        _add(db, "b")
        with pytest.raises(NotFoundError):
            await deploy.restore.plan(HOST, "20991231T000000000000Z-ffff")
        before = dump(store)
        plan = await deploy.restore.plan(HOST, snap.id)
        assert dump(store) == before and _rows(db) == ["a", "b"]
        done = await deploy.restore.restore(HOST, snap.id)
        assert _steps(store, done.op_id) == [s.kind for s in plan.steps if not s.journals_own]

    asyncio.run(run())
